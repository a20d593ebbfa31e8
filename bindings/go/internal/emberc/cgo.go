package emberc

// The C flags of the SWIG-generated package (emberc.go, ember_wrap.c, made
// by `go generate` or CMake next to this file) come from pkg-config: the
// ember.pc that `cmake --install` puts in PREFIX/lib/pkgconfig (set
// PKG_CONFIG_PATH to it for a prefix pkg-config does not search), or the
// build tree's (bindings/CMakeLists.txt).

// #cgo pkg-config: ember
import "C"
