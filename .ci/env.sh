# Sourced by tests/run and examples/demo: installs the Debian packages a step needs when missing,
# and creates (or reuses) the project's virtual environment in .venv with mcpd installed.
# Usage: mcpd_env "deb-package ..." "pip extras"

mcpd_apt() {
    local missing=()
    for package in "$@"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    [ ${#missing[@]} -eq 0 ] && return 0
    echo "installing Debian packages: ${missing[*]}" >&2
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

mcpd_env() {
    local packages="$1" extras="$2"
    # shellcheck disable=SC2086
    mcpd_apt python3 python3-venv python3-pip $packages
    if [ ! -x .venv/bin/python ]; then
        python3 -m venv .venv
    fi
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".${extras:+[$extras]}"
}
