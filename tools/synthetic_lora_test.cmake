# make_synthetic_model's adapter mode (--lora-for), run by CTest (tools/CMakeLists.txt):
#
#   cmake -DEXE=<make_synthetic_model> -DBASE=<a synthetic model .gguf> -DDIR=<scratch dir> -P synthetic_lora_test.cmake
#
# The same arguments write a byte-identical file, another seed another file, --lora-type f32 twice the
# tensor bytes; a rank outside 1..1024, a missing --out, an adapter given as the base and an option of the
# other mode are refused with a message and a non-zero exit status.
foreach(v EXE BASE DIR)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "synthetic_lora_test: -D${v}=... is required")
  endif()
endforeach()
file(MAKE_DIRECTORY "${DIR}")

function(lora out)  # lora(<out file> <more arguments...>): must succeed
  execute_process(COMMAND "${EXE}" --lora-for "${BASE}" --out "${out}" ${ARGN}
                  RESULT_VARIABLE rc OUTPUT_VARIABLE so ERROR_VARIABLE se)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "make_synthetic_model --lora-for ${BASE} --out ${out} ${ARGN}: exit ${rc}\n${so}${se}")
  endif()
  message(STATUS "${so}")
endfunction()

function(refused what expect)  # refused(<what> <message fragment> <all arguments...>): must fail with it
  execute_process(COMMAND "${EXE}" ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE so ERROR_VARIABLE se)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${what}: accepted (make_synthetic_model ${ARGN})")
  endif()
  string(FIND "${se}" "${expect}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "${what}: exit ${rc} without '${expect}' in:\n${se}")
  endif()
  message(STATUS "${what}: refused (exit ${rc})")
endfunction()

lora("${DIR}/a.gguf" --rank 4 --seed 1)
lora("${DIR}/b.gguf" --rank 4 --seed 1)
lora("${DIR}/c.gguf" --rank 4 --seed 2)
lora("${DIR}/d.gguf" --rank 4 --seed 1 --lora-type f32 --alpha 8 --lora-magnitude 0.5)
file(SHA256 "${DIR}/a.gguf" ha)
file(SHA256 "${DIR}/b.gguf" hb)
file(SHA256 "${DIR}/c.gguf" hc)
if(NOT ha STREQUAL hb)
  message(FATAL_ERROR "the same arguments wrote different files: ${ha} vs ${hb}")
endif()
if(ha STREQUAL hc)
  message(FATAL_ERROR "seeds 1 and 2 wrote the same file")
endif()
file(SIZE "${DIR}/a.gguf" sa)
file(SIZE "${DIR}/c.gguf" sc)
file(SIZE "${DIR}/d.gguf" sd)
if(NOT sa EQUAL sc OR NOT sd GREATER sa)
  message(FATAL_ERROR "sizes: f16 seed 1 ${sa}, seed 2 ${sc}, f32 ${sd}")
endif()
message(STATUS "adapter ${ha}: ${sa} bytes (f32: ${sd})")

refused("rank 0" "--rank must be" --lora-for "${BASE}" --rank 0 --out "${DIR}/x.gguf")
refused("rank 1025" "--rank must be" --lora-for "${BASE}" --rank 1025 --out "${DIR}/x.gguf")
refused("no rank" "needs --rank" --lora-for "${BASE}" --out "${DIR}/x.gguf")
refused("no --out" "--out is required" --lora-for "${BASE}" --rank 4)
refused("an adapter as the base" "not a model" --lora-for "${DIR}/a.gguf" --rank 4 --out "${DIR}/x.gguf")
refused("a missing base" "cannot read the base model" --lora-for "${DIR}/none.gguf" --rank 4 --out "${DIR}/x.gguf")
refused("a model option" "do not apply" --lora-for "${BASE}" --rank 4 --type f16 --out "${DIR}/x.gguf")
refused("--rank without --lora-for" "need --lora-for" --rank 4 --out "${DIR}/x.gguf")
refused("--lora-type f8" "--lora-type takes" --lora-for "${BASE}" --rank 4 --lora-type f8 --out "${DIR}/x.gguf")
if(EXISTS "${DIR}/x.gguf")
  message(FATAL_ERROR "a refused command left ${DIR}/x.gguf")
endif()
