# Sourced by the offline scripts: unpacks the .deb files in $debs into a
# private prefix and points pkg-config and the loader at it.
# In: debs (a folder of .deb files). Out: prefix, PKG_CONFIG_PATH,
# LD_LIBRARY_PATH.
# A fixed place, so the paths CMake caches stay valid from run to run.
prefix="$PWD/build-offline-deps"
rm -rf "$prefix"
mkdir -p "$prefix"
for f in "$debs"/*.deb; do
    dpkg -x "$f" "$prefix"
done
libdir=$(dirname "$(find "$prefix" -name 'libxxhash.pc' | head -n 1)")/..
libdir=$(cd "$libdir" && pwd)
# The packages' .pc files name /usr (as prefix, or in -L and -I flags):
# point them here.
for pc in "$libdir"/pkgconfig/*.pc; do
    sed -i -e "s|^prefix=.*|prefix=$prefix/usr|" \
        -e "s|-L/usr/|-L$prefix/usr/|g" -e "s|-I/usr/|-I$prefix/usr/|g" "$pc"
done
export PKG_CONFIG_PATH="$libdir/pkgconfig"
export LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

