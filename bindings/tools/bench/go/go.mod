module ember-bench

go 1.19

require ember v0.0.0

// The binding module as CMake builds it (bindings/CMakeLists.txt points this
// at the build tree's module when it builds the benchmark).
replace ember => ../../../../build/bindings/go/module
