module ember-package-test

go 1.19

require ember v0.0.0

// go_module_test.sh points this at the installed module (PREFIX/share/ember/go).
replace ember => ./installed-module
