#!/bin/sh
# Prepare a host for `gputrace record` (and its live tests): bcc's Python
# bindings, kernel headers linked for the running kernel, FUSE and the C
# toolchain for the test stand-ins, and strace/bpftrace/bpftool for the benchmarks.
# Needs root. Idempotent. Ends by checking that the live tests' needs are met.
set -eu

if [ "$(id -u)" != 0 ]; then
    echo "setup-record.sh: run as root" >&2
    exit 1
fi

need=""
[ -d /usr/lib/python3/dist-packages/bcc ] || need="$need python3-bpfcc"
ls -d /usr/src/linux-headers-*-amd64 >/dev/null 2>&1 || need="$need linux-headers-amd64"
command -v fusermount3 >/dev/null 2>&1 || need="$need fuse3"
[ -e /usr/include/fuse3/fuse.h ] || need="$need libfuse3-dev"
command -v strace >/dev/null 2>&1 || need="$need strace"
command -v bpftrace >/dev/null 2>&1 || need="$need bpftrace"
# benchmarks/ioctl_storm/progstats.py reads each BPF program's run time through it.
command -v bpftool >/dev/null 2>&1 || need="$need bpftool"
# The live tests build and mount the FUSE stand-ins (tests/standin*/): their
# toolchain check wants gcc, make, pkg-config (fuse3.pc), libc headers, binutils
# (nm/objdump/readelf) and gdb; a host missing one would skip every live test.
command -v gcc >/dev/null 2>&1 || need="$need gcc"
command -v make >/dev/null 2>&1 || need="$need make"
command -v pkg-config >/dev/null 2>&1 || need="$need pkg-config"
[ -e /usr/include/stdio.h ] || need="$need libc6-dev"
command -v nm >/dev/null 2>&1 || need="$need binutils"
command -v gdb >/dev/null 2>&1 || need="$need gdb"
# The live view's test drives `record --live` in a real terminal.
command -v tmux >/dev/null 2>&1 || need="$need tmux"
if [ -n "$need" ]; then
    if command -v apt-get >/dev/null 2>&1; then
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        # shellcheck disable=SC2086
        apt-get install -y -qq $need
    elif command -v dnf >/dev/null 2>&1; then
        echo "setup-record.sh: on RHEL/Fedora install: dnf install python3-bcc kernel-devel fuse3 fuse3-devel strace bpftrace bpftool gcc make pkgconf-pkg-config binutils gdb" >&2
        exit 1
    else
        echo "setup-record.sh: missing packages:$need" >&2
        exit 1
    fi
fi

# bcc compiles probes against /lib/modules/$(uname -r)/build. When the running
# kernel has no headers package (custom or VM kernels), link the distribution's
# generic headers: the probes use only tracepoint arguments, no kernel structs.
kver="$(uname -r)"
mod="/lib/modules/$kver"
if [ ! -e "$mod/source/include/linux/kconfig.h" ] && [ ! -e "$mod/build/include/linux/kconfig.h" ]; then
    hdr="$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1)"
    if [ -z "$hdr" ]; then
        echo "setup-record.sh: no kernel headers under /usr/src" >&2
        exit 1
    fi
    # Debian splits headers: build = <ver>-amd64 (generated config), source =
    # <ver>-common (include/linux/kconfig.h and the rest).
    common="${hdr%-amd64}-common"
    [ -d "$common" ] || common="$hdr"
    mkdir -p "$mod"
    ln -sfn "$hdr" "$mod/build"
    ln -sfn "$common" "$mod/source"
    echo "setup-record.sh: linked $mod/build -> $hdr, $mod/source -> $common"
fi

# tracefs (the recorder mounts it too when it is missing).
if [ ! -e /sys/kernel/tracing/events ]; then
    mount -t tracefs nodev /sys/kernel/tracing 2>/dev/null || true
fi
# What the live tests check before running (tests/standin/standin.py skip_reason):
# fail here, loudly, rather than let every live test skip later.
missing=""
for tool in gcc make pkg-config fusermount3 nm gdb; do
    command -v "$tool" >/dev/null 2>&1 || missing="$missing $tool"
done
pkg-config --exists fuse3 2>/dev/null || missing="$missing fuse3.pc(libfuse3-dev)"
[ -e /dev/fuse ] || missing="$missing /dev/fuse"
if [ -n "$missing" ]; then
    echo "setup-record.sh: still missing after install:$missing" >&2
    exit 1
fi
echo "setup-record.sh: ready"
