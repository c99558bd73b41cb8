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
    # Reinstall only when pyproject.toml, a native module's source or header, or the extras changed:
    # keeps repeated runs fast. An editable install compiles the C once; a changed source needs pip again.
    stamp="$top/.venv/.hostmq-installed"
    want="$( (cat "$top/pyproject.toml"; find "$top/hostmq" -name '*.c' -o -name '*.h' | LC_ALL=C sort | xargs cat) \
             | sha256sum | cut -c1-16)-$extras"
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

# System programs the tests and the bench compare against (Redis Streams is a peer in every bench
# table): installed from Debian's packages when missing and we may (root, or sudo without a password).
hostmq_system_deps() {
    command -v redis-server >/dev/null 2>&1 && return 0
    local sudo=""
    [ "$(id -u)" -eq 0 ] || { sudo -n true 2>/dev/null && sudo="sudo -n"; } || {
        echo "redis-server is missing and cannot be installed here (not root); bench peers will say so" >&2
        return 0
    }
    echo "installing redis-server (Debian package) for the bench peers" >&2
    $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1 || {
        $sudo apt-get update -q >/dev/null 2>&1 &&
        $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q redis-server >/dev/null 2>&1
    } || echo "apt-get could not install redis-server" >&2
    return 0
}
