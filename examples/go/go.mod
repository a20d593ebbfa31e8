module ember-chat-example

go 1.19

require ember v0.0.0

// The binding module as CMake builds it (the SWIG package is generated there).
replace ember => ../../build/bindings/go/module
