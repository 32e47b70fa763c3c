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
    # Reinstall only when the project's requirements change; pip's chatter goes to a log that is
    # shown only if the install fails.
    local stamp=".venv/.installed-${extras:-base}-$(sha256sum <pyproject.toml | cut -c1-16)"
    [ -e "$stamp" ] && return 0
    if ! .venv/bin/python -m pip install --disable-pip-version-check -e ".${extras:+[$extras]}" >.venv/pip.log 2>&1; then
        cat .venv/pip.log >&2
        return 1
    fi
    touch "$stamp"
}
