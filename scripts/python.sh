# Sourced by setup.sh, demo.sh and test.sh (bash): which Python they install into and
# run, and how Debian's bcc becomes importable there.
#
# PYTHON (default python3) is used as it is when it is a virtual environment's, or
# when it accepts installs. An interpreter that refuses them (PEP 668: an
# EXTERNALLY-MANAGED marker, as Debian 12's /usr/bin/python3 has) gets the checkout's
# .venv instead, made from it by setup.sh.

GPUTRACE_VENV=.venv
SYSTEM_DIST=/usr/lib/python3/dist-packages

# Exit status 0 when "$1" runs in a virtual environment.
in_venv() {
    "$1" -c 'import sys; sys.exit(0 if sys.prefix != sys.base_prefix else 1)'
}

# Exit status 0 when "$1" is an interpreter pip must not install into (PEP 668).
externally_managed() {
    "$1" -c 'import os, sys, sysconfig
marker = os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")
sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(marker) else 1)'
}

# Sets PY (the interpreter to install into and run) and BASE_PY (what PYTHON names).
pick_python() {
    BASE_PY=${PYTHON:-python3}
    if ! in_venv "$BASE_PY" && externally_managed "$BASE_PY"; then
        PY=$PWD/$GPUTRACE_VENV/bin/python
    else
        PY=$BASE_PY
    fi
}

# Makes "$1"'s virtual environment import the distribution's bcc (not on PyPI: bcc's
# Python package is pure Python calling libbcc through ctypes, so one package serves
# any Python 3). A .pth line adds a directory that holds only a link to bcc: adding
# all of dist-packages would put Debian's other modules, some built for another
# Python, behind every failed import of the environment.
bcc_visible() {
    local py=$1 site dir
    in_venv "$py" || return 0
    [[ -d $SYSTEM_DIST/bcc ]] || return 0
    "$py" -c 'import bcc' 2>/dev/null && return 0
    site=$("$py" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
    dir=$("$py" -c 'import sys; print(sys.prefix)')/system-bcc
    mkdir -p "$dir"
    ln -sfn "$SYSTEM_DIST/bcc" "$dir/bcc"
    echo "$dir" >"$site/gputrace-system-bcc.pth"
}
