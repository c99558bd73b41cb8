# Sourced by run.sh and test.sh: create .venv if missing and install hostmq with the given extras.
# Usage: hostmq_venv EXTRAS   (e.g. "dev,spark"; empty for none)
set -euo pipefail
hostmq_venv() {
    local top extras stamp want
    top="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
    extras="$1"
    if [ ! -x "$top/.venv/bin/python" ]; then
        python3 -m venv "$top/.venv"
    fi
    # Reinstall only when pyproject.toml or the extras changed: keeps repeated runs fast.
    stamp="$top/.venv/.hostmq-installed"
    want="$(sha256sum "$top/pyproject.toml" | cut -c1-16)-$extras"
    if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
        "$top/.venv/bin/python" -m pip install --quiet --upgrade pip >/dev/null 2>&1 || true
        local spec="$top"
        [ -n "$extras" ] && spec="$top[$extras]"
        echo "installing hostmq${extras:+ with $extras} into .venv (log: .venv/pip.log)" >&2
        if ! "$top/.venv/bin/python" -m pip install -e "$spec" > "$top/.venv/pip.log" 2>&1; then
            tail -40 "$top/.venv/pip.log" >&2
            echo "pip install failed; full log in .venv/pip.log" >&2
            return 1
        fi
        echo "$want" > "$stamp"
    fi
    export PATH="$top/.venv/bin:$PATH"
}
