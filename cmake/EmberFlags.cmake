# Compiler flags. The library's baseline is plain x86-64 (SSE2), so it loads
# and runs on any x86-64 CPU (never -march=native). Only kernel files carry an
# ISA, and only ever run after a run-time CPU check (cpu/cpu_features.h):
#   *_avx2.cpp    AVX2 + FMA + F16C + BMI2   (isa_supported(Isa::kAvx2))
#   *_avx512.cpp  AVX-512 F/BW/VL/DQ/VNNI/BF16 on top of those (Isa::kAvx512Vnni)
# An ISA file must not define code the linker could pick for baseline callers:
# no out-of-line inline/template functions shared with other files (keep its
# helpers in an anonymous namespace; allocate in the caller). The CTest test
# isa_objects_define_no_shared_code checks its objects for weak symbols.
set(EMBER_AVX2_FLAGS -mavx2 -mfma -mf16c -mbmi2)
set(EMBER_AVX512_FLAGS ${EMBER_AVX2_FLAGS} -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512vnni -mavx512bf16)

add_compile_options(-Wall -Wextra -Wno-unused-parameter)
if(EMBER_WERROR)
  add_compile_options(-Werror)
endif()
if(EMBER_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
if(EMBER_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "EMBER_FUZZ needs clang (configure with CC=clang CXX=clang++)")
  endif()
  # Coverage instrumentation everywhere; only the fuzz targets link libFuzzer.
  # UBSan reports stay recoverable so that tests/fuzz/ubsan.supp can name the
  # known, reported ones; tools/fuzz.sh sets halt_on_error=1 for the rest.
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer -g)
  add_link_options(-fsanitize=address,undefined)
endif()
if(EMBER_TSAN)
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
endif()

function(ember_apply_isa_flags target srcs)
  foreach(f ${srcs})
    if(f MATCHES "_avx512\\.cpp$")
      set_source_files_properties(${f} TARGET_DIRECTORY ${target} PROPERTIES COMPILE_OPTIONS "${EMBER_AVX512_FLAGS}")
    elseif(f MATCHES "_avx2\\.cpp$")
      set_source_files_properties(${f} TARGET_DIRECTORY ${target} PROPERTIES COMPILE_OPTIONS "${EMBER_AVX2_FLAGS}")
    endif()
  endforeach()
endfunction()

# Plugins and modules link with --no-undefined (a missing symbol is a link
# error, not a dlopen failure), except in sanitizer builds: clang leaves a
# shared object's sanitizer runtime symbols to the executable.
if(EMBER_SANITIZE OR EMBER_FUZZ OR EMBER_TSAN)
  set(EMBER_MODULE_NO_UNDEFINED)
else()
  set(EMBER_MODULE_NO_UNDEFINED -Wl,--no-undefined)
endif()
