# The GPU suite (tests/gpu/) on the emulated device (BELAY_CUDA_EMULATION), included by
# tests/CMakeLists.txt:
#  - every test case once per scheduler seed (BELAY_EMU_SEED): the threads of a block and
#    the blocks of a grid run in an order drawn from it, and so does the streams' work;
#  - each run appends how often every kernel ran to emulated-kernels.log
#    (emulation/coverage_log.cpp), which tests/emulation/kernel_coverage.sh turns into
#    "emulated kernels: N of M ran";
#  - planted_bugs: the suite rebuilt with one known bug planted at a time in a copy of the
#    kernels (tests/emulation/plant.py), each of which must be caught.
file(GLOB BELAY_GPU_TEST_SOURCES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/gpu/test_*.cpp)
add_library(belay_gpu_test_objects OBJECT ${BELAY_GPU_TEST_SOURCES})
target_include_directories(belay_gpu_test_objects PRIVATE ${CMAKE_CURRENT_SOURCE_DIR})
target_link_libraries(belay_gpu_test_objects PRIVATE belay_train Catch2::Catch2)
belay_test_options(belay_gpu_test_objects)

set(BELAY_EMU_COVERAGE_LOG ${CMAKE_BINARY_DIR}/emulated-kernels.log)
add_executable(belay_gpu_tests $<TARGET_OBJECTS:belay_gpu_test_objects> emulation/coverage_log.cpp)
target_link_libraries(belay_gpu_tests PRIVATE belay_train Catch2::Catch2WithMain)
target_compile_definitions(belay_gpu_tests PRIVATE BELAY_EMU_COVERAGE_LOG="${BELAY_EMU_COVERAGE_LOG}")

set(BELAY_EMU_SEEDS 1 2 3 CACHE STRING "scheduler seeds the emulated GPU suite runs under")
foreach(seed ${BELAY_EMU_SEEDS})
  # EXTRA_ARGS differ per seed so that each discovery writes files of its own (Catch2 v2
  # names them by a hash of its arguments).
  catch_discover_tests(belay_gpu_tests TEST_PREFIX "emu.seed${seed}." EXTRA_ARGS --rng-seed ${seed} PROPERTIES
    LABELS emulated SKIP_REGULAR_EXPRESSION "CTEST_SKIP:"
    ENVIRONMENT "BELAY_EMU_SEED=${seed}")
endforeach()

# The emulator's own tests (tests/emulation/test_simt.cu, test_runtime.cu): small kernels of their own,
# compiled as the kernel files are. A kernel fault is sticky for the process, so each fault
# case is a test case of its own, and CTest runs every case in a process of its own.
# Like every kernel file, through a generated unit that registers its __launch_bounds__.
# test_runtime.cu: the runtime's streams, events and last error, under several seeds.
belay_emulated_unit(${CMAKE_CURRENT_SOURCE_DIR}/emulation/test_simt.cu belay_test_simt_unit)
belay_emulated_unit(${CMAKE_CURRENT_SOURCE_DIR}/emulation/test_runtime.cu belay_test_runtime_unit)
set_source_files_properties(${belay_test_simt_unit} ${belay_test_runtime_unit} PROPERTIES
  COMPILE_OPTIONS "${BELAY_EMU_KERNEL_FLAGS}")
add_executable(belay_emulator_tests ${belay_test_simt_unit} ${belay_test_runtime_unit})
target_include_directories(belay_emulator_tests PRIVATE ${PROJECT_SOURCE_DIR})
target_compile_definitions(belay_emulator_tests PRIVATE BELAY_SOURCE_ROOT="${PROJECT_SOURCE_DIR}")
target_link_libraries(belay_emulator_tests PRIVATE belay_core Catch2::Catch2WithMain)
catch_discover_tests(belay_emulator_tests TEST_PREFIX "emu.simt." PROPERTIES LABELS "emulated")

# The misaligned-access check sees the vector accesses made through load_vector/store_vector
# only: no kernel source makes one otherwise.
add_test(NAME emu.vector_access_lint COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/emulation/vector_access_lint.sh
                                             ${PROJECT_SOURCE_DIR})
set_tests_properties(emu.vector_access_lint PROPERTIES LABELS emulated)

# belay train --device cuda, end to end on the emulated device: the CLI's own run, its CSV,
# and the same run on the CPU to compare with.
add_test(NAME emu.train_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/emulation/train_cli.sh $<TARGET_FILE:belay>)
set_tests_properties(emu.train_cli PROPERTIES LABELS emulated COST 20
  ENVIRONMENT "BELAY_EMU_COVERAGE=${BELAY_EMU_COVERAGE_LOG}")

# belay train --model gpt --device cuda: a tiny GPT's steps and held-out losses against the CPU's.
add_test(NAME emu.train_gpt_cli COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/emulation/train_gpt_cli.sh
                                        $<TARGET_FILE:belay> ${PROJECT_SOURCE_DIR})
set_tests_properties(emu.train_gpt_cli PROPERTIES LABELS emulated COST 20
  ENVIRONMENT "BELAY_EMU_COVERAGE=${BELAY_EMU_COVERAGE_LOG}")

# The memory-traffic targets (emulation/test_memory_metrics.cpp): a few representative launches
# with the emulator's per-site metrics on (kernels/cuda/emulation/memory_metrics.h); the table
# of every site they touched is written to emulated-kernel-metrics.txt.
add_library(belay_metrics_test_objects OBJECT emulation/test_memory_metrics.cpp)
target_include_directories(belay_metrics_test_objects PRIVATE ${PROJECT_SOURCE_DIR})
target_link_libraries(belay_metrics_test_objects PRIVATE belay_core Catch2::Catch2)
target_compile_definitions(belay_metrics_test_objects PRIVATE BELAY_SOURCE_DIR="${PROJECT_SOURCE_DIR}"
                                                              BELAY_BINARY_DIR="${CMAKE_BINARY_DIR}")
add_executable(belay_metrics_tests $<TARGET_OBJECTS:belay_metrics_test_objects>)
target_link_libraries(belay_metrics_tests PRIVATE belay_core Catch2::Catch2WithMain)
add_test(NAME emu.memory_metrics COMMAND belay_metrics_tests)
# COST: started among the first (27-39 s under ASan; registered last, it ran alone at the end).
set_tests_properties(emu.memory_metrics PROPERTIES LABELS emulated COST 40
  ENVIRONMENT "BELAY_EMU_METRICS=${CMAKE_BINARY_DIR}/emulated-kernel-metrics.txt")

# ---- planted bugs -----------------------------------------------------------------------
# belay_planted_bug(NAME FILE <planted file> RECOMPILE <files> FILTER <Catch test spec>
#                   [TESTS <object library>] [ASAN]): the planted file (and the other files that
# include it) compiled again against the mutant, linked before belay_core so that their
# definitions replace the library's, with the tests of TESTS (default: the GPU suite).
# Which build makes the mutants (BELAY_EMU_PLANTED): "all" (a developer's build), "asan" (only
# those marked ASAN, the bugs only AddressSanitizer sees: the sanitizer build of
# tests/sanitize.sh), "plain" (the others: the plain emulated build of
# tests/emulation/plain_release.sh, where a mutant compiles in half the time), "none".
# Target belay_planted_bugs builds the mutants of this build.
set(BELAY_EMU_PLANTED all CACHE STRING "planted bugs built here: all | asan | plain | none")
set_property(CACHE BELAY_EMU_PLANTED PROPERTY STRINGS all asan plain none)
add_custom_target(belay_planted_bugs)
set(BELAY_PLANTED_BUGS "")
function(belay_planted_bug name)
  cmake_parse_arguments(P "ASAN" "FILE;FILTER;TESTS" "RECOMPILE" ${ARGN})
  if(BELAY_EMU_PLANTED STREQUAL "none" OR (BELAY_EMU_PLANTED STREQUAL "asan" AND NOT P_ASAN)
     OR (BELAY_EMU_PLANTED STREQUAL "plain" AND P_ASAN))
    return()
  endif()
  if(NOT P_TESTS)
    set(P_TESTS belay_gpu_test_objects)
  endif()
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/planted/${name})
  add_custom_command(OUTPUT ${dir}/${P_FILE}
    COMMAND ${BELAY_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/emulation/plant.py ${name} ${PROJECT_SOURCE_DIR}
            ${dir}/${P_FILE}
    DEPENDS ${PROJECT_SOURCE_DIR}/${P_FILE} ${CMAKE_CURRENT_SOURCE_DIR}/emulation/plant.py
    COMMENT "planting ${name} in ${P_FILE}")
  set(sources ${dir}/${P_FILE})
  foreach(f ${P_RECOMPILE})
    if(NOT f STREQUAL P_FILE)
      configure_file(${PROJECT_SOURCE_DIR}/${f} ${dir}/${f} COPYONLY)
      list(APPEND sources ${dir}/${f})
    endif()
  endforeach()
  foreach(f ${sources})
    if(f MATCHES "\\.cu$")
      set_source_files_properties(${f} PROPERTIES LANGUAGE CXX COMPILE_OPTIONS "${BELAY_EMU_KERNEL_FLAGS}"
                                  OBJECT_DEPENDS ${dir}/${P_FILE})
    elseif(f MATCHES "\\.cpp$")
      set_source_files_properties(${f} PROPERTIES OBJECT_DEPENDS ${dir}/${P_FILE})
    endif()
  endforeach()
  add_executable(planted_${name} ${sources} $<TARGET_OBJECTS:${P_TESTS}>)
  # The mutant's directory first: `#include "kernels/cuda/x.h"` finds the planted copy.
  target_include_directories(planted_${name} BEFORE PRIVATE ${dir})
  # -O1: a mutant runs one test case, and its build is what it costs CI (the tensor-core GEMM
  # file under the sanitizers: 64 s of CPU at -O1, 126 s at the build's -O2).
  target_compile_options(planted_${name} PRIVATE -O1)
  target_link_libraries(planted_${name} PRIVATE belay_train Catch2::Catch2WithMain)
  add_dependencies(belay_planted_bugs planted_${name})
  set(BELAY_PLANTED_BUGS ${BELAY_PLANTED_BUGS} "${name}|$<TARGET_FILE:planted_${name}>|${P_FILTER}" PARENT_SCOPE)
endfunction()

belay_planted_bug(block_sum_barrier FILE kernels/cuda/block_reduce.cuh
  RECOMPILE kernels/cuda/reduce_kernels.cu kernels/cuda/guard_kernels.cu kernels/cuda/cross_entropy_kernels.cu
  FILTER "cuda sum and sum_rows match FP64 and repeat bit for bit")
belay_planted_bug(gemm_wait_group FILE kernels/cuda/gemm_tensor_core.cu
  RECOMPILE kernels/cuda/gemm_tensor_core.cu
  FILTER "cuda gemm fp16 and bf16 (tensor cores) match FP64 in every layout and odd shape")
# A read one element past the row: the value is multiplied by B's predicated zero, so no
# result changes; only AddressSanitizer sees it (at the last row, past the allocation).
belay_planted_bug(edge_predicate_k FILE kernels/cuda/gemm_simt_f32.cu ASAN
  RECOMPILE kernels/cuda/gemm_simt_f32.cu
  FILTER "cuda gemm fp32 (SIMT) matches FP64 in every layout and odd shape")
belay_planted_bug(bmm_stride_b FILE kernels/cuda/gemm_dispatch.cu
  RECOMPILE kernels/cuda/gemm_dispatch.cu
  FILTER "cuda batched gemm fp16 and bf16 (tensor cores): items match FP64 and the unbatched bits")
belay_planted_bug(swizzle_collision FILE kernels/cuda/gemm_layout.h
  RECOMPILE kernels/cuda/gemm_tensor_core.cu kernels/cuda/gemm_simt_f32.cu kernels/cuda/gemm_dispatch.cu
            kernels/cuda/cuda_backend.cpp
  FILTER "cuda gemm fp16 and bf16 (tensor cores) match FP64 in every layout and odd shape")
# Only the tensor-core GEMM's file is recompiled (the costly one, ~95 s of CPU): the other
# includers of gemm_layout.h do not use the swizzle, and the mutant's objects come first at
# the link, so an out-of-line copy of a layout function is the mutant's everywhere.
belay_planted_bug(swizzle_off FILE kernels/cuda/gemm_layout.h
  RECOMPILE kernels/cuda/gemm_tensor_core.cu
  TESTS belay_metrics_test_objects
  FILTER "memory metrics: the tensor-core GEMM's cp.async stores and ldmatrix reads make no bank conflict")
belay_planted_bug(chunk_boundary FILE kernels/cuda/multi_tensor.cuh
  RECOMPILE kernels/cuda/guard_kernels.cu kernels/cuda/optimizer_kernels.cu
  FILTER "cuda adamw follows the CPU step by step and is a no-op under found_inf")
belay_planted_bug(census_lane FILE kernels/cuda/census_count.cuh
  RECOMPILE kernels/cuda/guard_kernels.cu kernels/cuda/cast_kernels.cu
  FILTER "cuda guard census: every count against the reference and the outputs unchanged")
belay_planted_bug(readback_no_wait FILE kernels/cuda/pinned_transfers.cpp
  RECOMPILE kernels/cuda/pinned_transfers.cpp
  FILTER "cuda read_async returns the scalars in order*")
belay_planted_bug(embedding_sum_order FILE kernels/cuda/embedding_kernels.cu
  RECOMPILE kernels/cuda/embedding_kernels.cu
  FILTER "cuda embedding backward gives the bits of the sequential loop as the CPU backend does")
belay_planted_bug(embedding_chunk_barrier FILE kernels/cuda/embedding_kernels.cu
  RECOMPILE kernels/cuda/embedding_kernels.cu
  FILTER "cuda embedding backward gives the bits of the sequential loop as the CPU backend does")
belay_planted_bug(layer_norm_chunk_overlap FILE kernels/cuda/layer_norm_kernels.cu
  RECOMPILE kernels/cuda/layer_norm_kernels.cu
  FILTER "cuda layer_norm and its backward match FP64 for dx and dweight and dbias")
belay_planted_bug(attention_mask_off_by_one FILE kernels/cuda/attention_layout.h
  RECOMPILE kernels/cuda/attention_kernels.cu kernels/cuda/attention_forward_tc.cu kernels/cuda/attention_backward.cu
            kernels/cuda/attention_backward_tc.cu
  FILTER "cuda attention fp16 (tensor cores) forward and backward match FP64")
belay_planted_bug(attention_sum_not_rescaled FILE kernels/cuda/attention_forward_tc.cu
  RECOMPILE kernels/cuda/attention_forward_tc.cu
  FILTER "cuda attention fp16 (tensor cores) forward and backward match FP64")
belay_planted_bug(attention_lse_not_saved FILE kernels/cuda/attention_forward_tc.cu
  RECOMPILE kernels/cuda/attention_forward_tc.cu
  FILTER "cuda attention fp16 (tensor cores) forward and backward match FP64")
belay_planted_bug(attention_stage_barrier FILE kernels/cuda/attention_forward_tc.cu
  RECOMPILE kernels/cuda/attention_forward_tc.cu
  FILTER "cuda attention over 200 keys in four tiles matches FP64 causal and not")
belay_planted_bug(attention_bwd_ds_no_dsum FILE kernels/cuda/attention_backward_tc.cu
  RECOMPILE kernels/cuda/attention_backward_tc.cu
  FILTER "cuda attention fp16 (tensor cores) forward and backward match FP64")
belay_planted_bug(attention_bwd_stage_barrier FILE kernels/cuda/attention_backward_tc.cu
  RECOMPILE kernels/cuda/attention_backward_tc.cu
  FILTER "cuda attention backward on tensor cores over several tiles in every head dim and with Tq unlike Tk")

# --dist nccl on 2 ranks of the emulated device, and the emulated NCCL's ring on 3
# (tests/dist/nccl_test.sh); only where MPI (and so NCCL) is built.
if(BELAY_HAVE_NCCL)
  add_executable(nccl_ring_tests ${CMAKE_CURRENT_SOURCE_DIR}/dist/test_nccl_ring.cpp)
  target_link_libraries(nccl_ring_tests PRIVATE belay_core Catch2::Catch2WithMain)
  add_test(NAME emu.dist_nccl COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/dist/nccl_test.sh $<TARGET_FILE:belay>
           $<TARGET_FILE:compare_checkpoints> $<TARGET_FILE:nccl_ring_tests>)
  set_tests_properties(emu.dist_nccl PROPERTIES LABELS emulated SKIP_RETURN_CODE 77 COST 90)
  # A planted bug in the NCCL path: the ring's reduction order shifted by one rank (chunk c
  # summed from x_{c-1}), which only the order check on 3 ranks sees. The mutant nccl.cpp is
  # linked before belay_core; planted_bugs.sh runs it through a wrapper that starts mpirun.
  # Not an ASan-only bug: built where the plain mutants are.
endif()
if(BELAY_HAVE_NCCL AND (BELAY_EMU_PLANTED STREQUAL "all" OR BELAY_EMU_PLANTED STREQUAL "plain"))
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/planted/nccl_ring_order)
  add_custom_command(OUTPUT ${dir}/kernels/cuda/emulation/nccl.cpp
    COMMAND ${BELAY_PYTHON3} ${CMAKE_CURRENT_SOURCE_DIR}/emulation/plant.py nccl_ring_order ${PROJECT_SOURCE_DIR}
            ${dir}/kernels/cuda/emulation/nccl.cpp
    DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/emulation/nccl.cpp ${CMAKE_CURRENT_SOURCE_DIR}/emulation/plant.py
    COMMENT "planting nccl_ring_order in kernels/cuda/emulation/nccl.cpp")
  add_executable(planted_nccl_ring_order ${dir}/kernels/cuda/emulation/nccl.cpp
                 ${CMAKE_CURRENT_SOURCE_DIR}/dist/test_nccl_ring.cpp)
  target_link_libraries(planted_nccl_ring_order PRIVATE belay_core Catch2::Catch2WithMain)
  add_dependencies(belay_planted_bugs planted_nccl_ring_order)
  file(GENERATE OUTPUT ${dir}/run.sh CONTENT "#!/usr/bin/env bash
[ -x $<TARGET_FILE:planted_nccl_ring_order> ] || { echo \"belay-planted: $<TARGET_FILE:planted_nccl_ring_order> was not built\"; exit 1; }
export OMPI_MCA_btl_vader_single_copy_mechanism=none
ASAN_OPTIONS=\"\${ASAN_OPTIONS:+\$ASAN_OPTIONS:}detect_leaks=0\" exec mpirun --allow-run-as-root --oversubscribe -np 3 $<TARGET_FILE:planted_nccl_ring_order> \"\$@\"
" FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  list(APPEND BELAY_PLANTED_BUGS
       "nccl_ring_order|${dir}/run.sh|emulated ncclAllReduce sums in the dtype along the ring in order on the stream")
endif()

if(BELAY_PLANTED_BUGS)
  add_test(NAME planted_bugs COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/emulation/planted_bugs.sh ${BELAY_PLANTED_BUGS})
  set_tests_properties(planted_bugs PROPERTIES LABELS "emulated" COST 40)
endif()
if(BELAY_PLANTED_BUGS AND BELAY_EMU_LINE_COVERAGE)
  # A mutant's lines are not the GPU path's: its runs' profiles go elsewhere, uncounted.
  set_tests_properties(planted_bugs PROPERTIES ENVIRONMENT "LLVM_PROFILE_FILE=${CMAKE_BINARY_DIR}/profraw-planted/%m-%p.profraw")
endif()
