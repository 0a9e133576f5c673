"""Token counting and the written report of benchmarks/locomo.py (docs/MEMORY_QUALITY.md)."""

from __future__ import annotations

from typing import Any

from _common import ROOT

DOC = ROOT / "docs" / "MEMORY_QUALITY.md"
SVG = ROOT / "docs" / "img" / "locomo_recall.svg"
LABELS = {
    "mnemoflow": "mnemoflow (injected memory)",
    "bm25": "BM25 over raw turns",
    "dense": "dense over raw turns (USE)",
    "recency": "recency (last turns)",
}


class _Counter:
    def __init__(self, name: str, fn: Any) -> None:
        self.name, self._fn = name, fn

    def __call__(self, text: str) -> int:
        return int(self._fn(text))


def token_counter() -> _Counter:
    """cl100k_base token counts: tiktoken if its encoding file loads (it downloads it once),
    else bpe-openai (same vocabulary, bundled, offline), else the estimate the middleware
    budgets with (memory.text.estimate_tokens), named as such in the results."""
    try:
        import tiktoken

        enc = tiktoken.get_encoding("cl100k_base")
        return _Counter("cl100k_base (tiktoken)", lambda t: len(enc.encode(t)))
    except Exception:
        pass
    try:
        import bpe_openai

        enc2 = bpe_openai.get_encoding("cl100k_base")
        return _Counter("cl100k_base (bpe-openai)", lambda t: len(enc2.encode(t)))
    except Exception:
        pass
    from mnemoflow.memory.text import estimate_tokens

    return _Counter("estimate (chars/4, CJK 1 per char)", estimate_tokens)


def _svg(overall: dict[str, Any]) -> str:
    sides = list(LABELS)
    width, bar_h, gap, left = 640, 22, 10, 230
    height = 40 + len(sides) * 2 * (bar_h + gap)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
        'font-family="sans-serif" font-size="12">',
        '<text x="10" y="18" font-weight="bold">LoCoMo evidence recall at the same token '
        "budget (dark: all evidence, light: any)</text>",
    ]
    y = 34
    for side in sides:
        for key, colour in (("evidence_recall_all", "#2c5f8a"), ("evidence_recall_any", "#9cc3e4")):
            value = overall[side][key]
            w = int((width - left - 60) * value)
            out.append(f'<rect x="{left}" y="{y}" width="{w}" height="{bar_h}" fill="{colour}"/>')
            out.append(f'<text x="{left + w + 4}" y="{y + 15}">{value:.2f}</text>')
            if key == "evidence_recall_all":
                out.append(f'<text x="10" y="{y + 15}">{LABELS[side]}</text>')
            y += bar_h + 2
        y += gap
    out.append("</svg>")
    return "\n".join(out) + "\n"


def write_report(result: dict[str, Any]) -> None:
    """docs/MEMORY_QUALITY.md and its plot, from one run's results."""
    overall = result["overall"]
    meta = result.get("_meta", {})
    convs = result["conversations"]
    lines = [
        "# Memory quality on LoCoMo",
        "",
        "Written by `python benchmarks/locomo.py` (results: `benchmarks/results/locomo.json`).",
        "What it measures and how: the docstring of `benchmarks/locomo.py`. A question counts",
        "for evidence recall when every one of its evidence turns appears (case and whitespace",
        "normalised) in the memory part of the system prompt of the model call that answers it.",
        "",
        f"Run: {len(convs)} conversation(s) ({', '.join(convs)}), {overall['questions']} "
        f"questions ({overall['with_evidence']} with evidence turns), memory budget "
        f"{result['budget_tokens']} tokens, tokens counted with {result['tokenizer']}.",
        "",
        "| side | evidence recall (all) | (any) | answer contained | median tokens |",
        "|---|---|---|---|---|",
    ]
    for side, label in LABELS.items():
        s = overall[side]
        lines.append(
            f"| {label} | {s['evidence_recall_all']:.2f} | {s['evidence_recall_any']:.2f} | "
            f"{s['answer_contained']:.2f} | {s['median_tokens']:.0f} |"
        )
    lines += [
        "",
        "![evidence recall](img/locomo_recall.svg)",
        "",
        "By category (evidence recall, all):",
        "",
        "| category | n | " + " | ".join(LABELS) + " |",
        "|---|---|" + "---|" * len(LABELS),
    ]
    for cat, c in overall["by_category"].items():
        values = " | ".join(f"{c[side]:.2f}" for side in LABELS)
        lines.append(f"| {cat} | {c['n']} | {values} |")
    lines += [
        "",
        "Per conversation:",
        "",
        "| conversation | turns | full context tokens | ingest s | rounds | fragments | "
        "mnemoflow | BM25 | retrieval p50 / p95 ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, c in convs.items():
        ing, s = c["ingest"], c["summary"]
        full = result["full_context_tokens"].get(name, 0)
        lines.append(
            f"| {name} | {ing['turns']} | {full} | {ing['ingest_s']} | {ing['rounds']} | "
            f"{ing['fragments']} | {s['mnemoflow']['evidence_recall_all']:.2f} | "
            f"{s['bm25']['evidence_recall_all']:.2f} | {s['retrieval']['p50_ms']} / "
            f"{s['retrieval']['p95_ms']} |"
        )
    lines += [
        "",
        f"Machine: {meta.get('cpus', '?')} CPUs shared with other work, load average "
        f"{meta.get('load_avg_1_5_15', '?')}; commit {meta.get('commit', '?')}, "
        f"{meta.get('run_at', '?')}.",
        "",
    ]
    DOC.parent.mkdir(parents=True, exist_ok=True)
    DOC.write_text("\n".join(lines))
    SVG.parent.mkdir(parents=True, exist_ok=True)
    SVG.write_text(_svg(overall))
    print(f"wrote {DOC.relative_to(ROOT)} and {SVG.relative_to(ROOT)}", flush=True)
