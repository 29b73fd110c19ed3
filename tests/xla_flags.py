"""XLA flags of the test processes: cheap XLA:CPU compiles. The tests' models are tiny, so
compiling dominates their time, and LLVM's optimisation passes change no result they check."""

FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
