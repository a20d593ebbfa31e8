# Checks that the objects of the ISA kernel files (*_avx2.cpp, *_avx512.cpp)
# define no weak symbols. A weak (COMDAT) definition, such as an inline or
# template function compiled out of line, is merged by the linker with the
# same function from baseline files, and the copy it keeps may be the one
# compiled for AVX2: a baseline caller would then die with SIGILL on a CPU
# without AVX2. ISA files keep their helpers in anonymous namespaces and
# leave allocation to their (baseline) callers; this test keeps it so.
#   cmake -DNM=nm -DOBJECTS="a.o|b.o|..." -P check_isa_objects.cmake
string(REPLACE "|" ";" objects "${OBJECTS}")
set(checked 0)
set(bad "")
foreach(o ${objects})
  if(NOT o MATCHES "_avx(2|512)\\.cpp\\.o$")
    continue()
  endif()
  math(EXPR checked "${checked} + 1")
  execute_process(COMMAND ${NM} -C --defined-only ${o} OUTPUT_VARIABLE out RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${NM} failed on ${o}")
  endif()
  string(REPLACE "\n" ";" lines "${out}")
  foreach(l ${lines})
    if(l MATCHES "^[0-9a-f]* [WVuw] ")
      string(APPEND bad "\n  ${o}: ${l}")
    endif()
  endforeach()
endforeach()
if(checked LESS 3)
  message(FATAL_ERROR "expected at least 3 ISA objects (matmul_avx2, matmul_avx512, backend_kernels_avx2), found ${checked}")
endif()
if(bad)
  message(FATAL_ERROR "ISA objects define weak symbols the linker could give to baseline code:${bad}")
endif()
message(STATUS "${checked} ISA objects define no weak symbols")
