# ctest_properties.cmake: read by ctest after the discovered tests (${hgrn_tests_TESTS}); CMakeLists.txt generates it
# into the build directory with generator expressions evaluated.

# One OpenMP thread per test: ctest runs tests in parallel, and spinning OpenMP teams would fight over the cores.
# Every CUDA block starts as NaN bytes in tests, so a kernel that leaves an output element unwritten fails.
set_tests_properties(${hgrn_tests_TESTS} PROPERTIES ENVIRONMENT
                     "HGRN_BINARY=$<TARGET_FILE:hgrn>;OMP_NUM_THREADS=1;HGRN_POISON_CUDA_ALLOC=1")

# The tests that take a second or more (CPU training runs, whole-model gradient checks, mpirun jobs): started first,
# so that a fresh build's first ctest run (no timing data yet) does not end waiting on one of them.
foreach(test IN LISTS hgrn_tests_TESTS)
  if(test MATCHES "^(Training\\.(ShortMqarRunLearns|InitFromAnHf)|Members/LinearAttentionTraining\\.|Models/EveryModelType\\.(EveryParameter|TiedEmbeddings)GradientMatches|Distributed\\.|TokenizerHf\\.|Cli\\.Bench|Signals\\.|DataSources\\.TrainsAndEvaluates)")
    set_tests_properties("${test}" PROPERTIES COST 10)
  endif()
endforeach()
