# The CPU kernels per vector ISA: each source listed here is compiled once per path, with
# exactly that path's flags (never -march=native: one binary runs on every x86-64 CPU and
# kernels/cpu/cpu_isa.cpp picks the path at run time). Each copy gets BELAY_ISA_NS
# (isa_<path>) for its own code and BELAY_EIGEN_NS (Eigen_<path>) to rename Eigen, so no
# template is shared between copies (docs/toolchain.md: the linker keeps one copy of a
# weak symbol, which would run AVX-512 code on an AVX2 CPU, or baseline code everywhere).
#
# avx512bf16 is avx512 plus VDPBF16PS: only the GEMM (its BF16 x BF16 products), the fused
# attention's BF16 products (attention_vdpbf16.cpp) and the bench's peak loop differ, so only
# those files get that copy; the element kernels and the
# Eigen comparison of that path are the avx512 ones (kernels/cpu/cpu_gemm.cpp, cpu_convert.cpp).
set(BELAY_CPU_ISAS baseline avx2 avx512)
set(BELAY_ISA_FLAGS_baseline "")
set(BELAY_ISA_FLAGS_avx2 -mavx2 -mfma -mf16c)
set(BELAY_ISA_FLAGS_avx512 -mavx512f -mavx512bw -mavx512vl -mavx512dq -mfma -mf16c)
set(BELAY_ISA_FLAGS_avx512bf16 ${BELAY_ISA_FLAGS_avx512} -mavx512bf16)
# g++ 12 warns "may be used uninitialized" inside its own avx512fintrin.h (the _mm512_undefined
# idiom, inlined into Eigen's packet code): noise from the system headers, not our code.
set(BELAY_ISA_WARN_avx512 $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized>)
set(BELAY_ISA_WARN_avx512bf16 ${BELAY_ISA_WARN_avx512})
# amx is avx512bf16 plus the tile instructions: only gemm_amx.cpp (its BF16 x BF16 products),
# attention_amx.cpp (the fused attention's BF16 products) and the bench's tile peak loop.
# amx_emulated is the same two files on the emulator of kernels/cpu/isa/amx_tiles.h, for
# baseline x86-64: it runs on every CPU (tests).
set(BELAY_ISA_FLAGS_amx ${BELAY_ISA_FLAGS_avx512bf16} -mamx-tile -mamx-bf16)
set(BELAY_ISA_WARN_amx ${BELAY_ISA_WARN_avx512})
set(BELAY_ISA_FLAGS_amx_emulated "")

# belay_add_isa_objects(<prefix> [ISAS <isa>...] SOURCES <source>...): OBJECT libraries
# <prefix>_<isa> (every path in BELAY_CPU_ISAS unless ISAS names some); their objects are
# listed in <prefix>_OBJECTS (a generator expression) in the caller's scope.
function(belay_add_isa_objects prefix)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "ISAS;SOURCES")
  if(NOT arg_ISAS)
    set(arg_ISAS ${BELAY_CPU_ISAS})
  endif()
  set(objects "")
  foreach(isa IN LISTS arg_ISAS)
    add_library(${prefix}_${isa} OBJECT ${arg_SOURCES})
    target_include_directories(${prefix}_${isa} PRIVATE ${PROJECT_SOURCE_DIR})
    target_link_libraries(${prefix}_${isa} PRIVATE Eigen3::Eigen OpenMP::OpenMP_CXX)
    target_compile_definitions(${prefix}_${isa} PRIVATE BELAY_ISA_NS=isa_${isa} BELAY_EIGEN_NS=Eigen_${isa}
                                                        BELAY_ISA_${isa}=1)
    # -ffp-contract=off: no multiply-add is fused unless the code says so (the element kernels
    # must give the baseline's bits); -fno-math-errno: sqrtf can vectorize (no errno branch).
    target_compile_options(${prefix}_${isa} PRIVATE ${BELAY_ISA_FLAGS_${isa}} -ffp-contract=off -fno-math-errno
                                                    -Wall -Wextra ${BELAY_ISA_WARN_${isa}})
    list(APPEND objects $<TARGET_OBJECTS:${prefix}_${isa}>)
  endforeach()
  set(${prefix}_OBJECTS ${objects} PARENT_SCOPE)
endfunction()

belay_add_isa_objects(belay_cpu_isa SOURCES ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/gemm_f32.cpp
                      ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/gemm_packed.cpp
                      ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/element_blocks.cpp
                      ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/attention_tiles.cpp
                      ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/classifier_rows.cpp)
target_sources(belay_core PRIVATE ${belay_cpu_isa_OBJECTS})
belay_add_isa_objects(belay_cpu_isa_bf16 ISAS avx512bf16 SOURCES ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/gemm_packed.cpp
                      ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/attention_vdpbf16.cpp)
target_sources(belay_core PRIVATE ${belay_cpu_isa_bf16_OBJECTS})
belay_add_isa_objects(belay_cpu_isa_amx ISAS amx amx_emulated SOURCES ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/gemm_amx.cpp
                      ${PROJECT_SOURCE_DIR}/kernels/cpu/isa/attention_amx.cpp)
target_compile_definitions(belay_cpu_isa_amx_amx_emulated PRIVATE BELAY_AMX_EMULATED=1)
target_sources(belay_core PRIVATE ${belay_cpu_isa_amx_OBJECTS})
