#!/usr/bin/env bash
# offline_deps.sh: for a build machine that reaches no package registry (e.g. a lent GPU machine) and lacks some of
# the libraries setup.sh installs: unpacks the carried Debian packages of each missing one (its -dev and runtime
# packages, fetched beforehand on a machine with apt: see DEBS below) into PREFIX, points their pkg-config files at
# PREFIX, and prints the shell lines that make the build find them (eval them, then configure as usual; the binaries
# carry an RPATH to PREFIX). Libraries the machine already has are left alone.
# Usage: eval "$(scripts/offline_deps.sh DEB_DIR [PREFIX])"   (PREFIX default /tmp/hgrn-deps)
#   fetch: mkdir -p DEB_DIR && (cd DEB_DIR && apt-get download libpcre2-dev libpcre2-8-0 libutf8proc-dev libutf8proc2 \
#            libzstd-dev libzstd1 libopenblas-openmp-dev libopenblas0-openmp libgtest-dev)
set -euo pipefail
debs=$(cd "${1:?usage: offline_deps.sh DEB_DIR [PREFIX]}" && pwd)
prefix=${2:-/tmp/hgrn-deps}
arch=x86_64-linux-gnu
mkdir -p "$prefix"
unpack() {  # package names (without version): each DEB_DIR/NAME_*.deb into PREFIX
  for name in "$@"; do
    local deb
    deb=$(ls "$debs/${name}"_*.deb 2>/dev/null | head -1)
    [ -n "$deb" ] || { echo "offline_deps: no ${name}_*.deb in $debs" >&2; exit 1; }
    dpkg -x "$deb" "$prefix"
  done
}
missing=()
pkg-config --exists libpcre2-8 || { unpack libpcre2-dev libpcre2-8-0; missing+=(pcre2); }
pkg-config --exists libutf8proc || { unpack libutf8proc-dev libutf8proc2; missing+=(utf8proc); }
pkg-config --exists libzstd || { unpack libzstd-dev libzstd1; missing+=(zstd); }
[ -f "/usr/lib/$arch/cmake/GTest/GTestConfig.cmake" ] || [ -f /usr/lib/cmake/GTest/GTestConfig.cmake ] ||
  { unpack libgtest-dev; missing+=(gtest); }
cmake_args=()
if [ ! -d "/usr/lib/$arch/openblas-openmp" ] && ! pkg-config --exists openblas; then
  unpack libopenblas-openmp-dev libopenblas0-openmp
  missing+=(openblas)
  cmake_args+=("-DOPENBLAS_OPENMP_LIBRARY=$prefix/usr/lib/$arch/openblas-openmp/libopenblas.so"
               "-DOPENBLAS_OPENMP_INCLUDE=$prefix/usr/include/$arch/openblas-openmp")
fi
# The packages' .pc files name prefix=/usr, every other path in them derives from it; some say libdir=.../lib where
# the library sits in lib/$arch (which the linker searches by itself only under /usr).
find "$prefix" -name '*.pc' -exec sed -i -e "s|^prefix=/usr\$|prefix=$prefix/usr|" \
  -e "s|^libdir=\\\${exec_prefix}/lib\$|libdir=\\\${exec_prefix}/lib/$arch|" {} +
echo "offline_deps: unpacked into $prefix: ${missing[*]:-nothing (all present)}" >&2
echo "export PKG_CONFIG_PATH=$prefix/usr/lib/$arch/pkgconfig\${PKG_CONFIG_PATH:+:\$PKG_CONFIG_PATH}"
echo "export CMAKE_PREFIX_PATH=$prefix/usr\${CMAKE_PREFIX_PATH:+:\$CMAKE_PREFIX_PATH}"
echo "export LD_LIBRARY_PATH=$prefix/usr/lib/$arch:$prefix/usr/lib/$arch/openblas-openmp\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
echo "export HGRN_CMAKE_ARGS=\"\${HGRN_CMAKE_ARGS:-} ${cmake_args[*]:-}\""
