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

# perf_analyzer, Triton's load generator, as NVIDIA builds it: the binary in the tritonclient
# 2.51.0 wheel (data/bin/perf_analyzer), unchanged. Later wheels' binaries need glibc 2.38 (Debian 12
# has 2.36), and `pip install perf-analyzer` on Debian 12 gives 0.1.0, a placeholder without the
# program. It links libb64.so.0d (Debian's libb64-0d) and libcudart.so.12 (PyPI's
# nvidia-cuda-runtime-cu12, a test dependency in pyproject.toml; no GPU is needed for HTTP and
# system shared memory). The wheel is not installed: it pins numpy<2. Its binary goes to
# .venv/libexec, and .venv/bin/perf_analyzer runs it with the CUDA runtime on its library path.
# The wheel is cached under build/, so once fetched this runs offline.
MCPD_PERF_ANALYZER_WHEEL_VERSION=2.51.0
mcpd_perf_analyzer() {
    local binary=.venv/libexec/perf_analyzer
    mcpd_apt libb64-0d
    if [ ! -x "$binary" ]; then
        local cache=build/wheels
        mkdir -p "$cache" .venv/libexec
        .venv/bin/python -m pip download --disable-pip-version-check --quiet --no-deps \
            --only-binary=:all: --dest "$cache" "tritonclient==$MCPD_PERF_ANALYZER_WHEEL_VERSION"
        .venv/bin/python - "$cache" "$binary" "$MCPD_PERF_ANALYZER_WHEEL_VERSION" <<'PY'
import glob, os, sys, zipfile
cache, binary, version = sys.argv[1:]
(wheel,) = glob.glob(f"{cache}/tritonclient-{version}-*.whl")
with zipfile.ZipFile(wheel) as archive, open(binary + ".part", "wb") as out:
    out.write(archive.read(f"tritonclient-{version}.data/data/bin/perf_analyzer"))
os.chmod(binary + ".part", 0o755)
os.rename(binary + ".part", binary)
PY
    fi
    local cudart
    cudart="$(.venv/bin/python -c 'import nvidia.cuda_runtime as c, os; print(os.path.join(list(c.__path__)[0], "lib"))')"
    cat >.venv/bin/perf_analyzer <<SH
#!/bin/sh
# perf_analyzer from the tritonclient $MCPD_PERF_ANALYZER_WHEEL_VERSION wheel (.ci/env.sh), with the CUDA runtime it links.
LD_LIBRARY_PATH="$cudart\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$PWD/$binary" "\$@"
SH
    chmod +x .venv/bin/perf_analyzer
}
