#!/usr/bin/env bash
# One device call's worth of GPU evidence, with everything it writes packed into one archive.
#
#   bash benchmarks/device_run.sh OUT_DIR STEP [STEP ...]
#
# Steps run in order; each writes under OUT_DIR/<step>/ and logs to OUT_DIR/<step>*.log; a failing step does
# not stop the next. At the end OUT_DIR is packed into OUT_DIR.tgz (a device call returns only a few files of at
# most 16 MiB each: one archive, checkpoints and generated images left out, loses nothing else; where OUT_DIR is a
# folder of $OUT it is removed once packed, so that the archive alone comes back). Steps:
#   install            pip install -e . into the interpreter that runs the rest (the README's backend="launchless"
#                      block and the CLI need the entry points); run it first. WHEELS=dir installs the wheels
#                      there as well (the device downloads nothing: the differential diffusers rows need diffusers);
#                      then imports the heavy modules once, so that their bytecode is kept before anything is timed,
#                      and logs what AOTInductor builds packages with (toolchain.log: CUDA_HOME, nvcc, a C++ compiler)
#   tests              python -m pytest -m cuda (all GPU tests; more than one device call holds: use the parts)
#   tests-at-once      tests-core, tests-serving, tests-compiled, tests-fresh-inputs and tests-differential as five
#                      processes side by side on the one GPU (a test that judges speed may read the others' load: run
#                      it again alone; tests whose subject is not speed judge every graph faster); run
#                      it alone in its device call: beside another step's processes (a differential run) the GPU's
#                      memory runs out and the speed tests judge the other work's load
#   tests-alone        TESTS="file or node id ..." (K="pytest -k expression") in one process: tests run again alone
#   tests-core         the parts of it one device call holds: the runtime, coverage, splits, hazard catalogue,
#   tests-serving      README, bench, compiler and training tests (core); decoding, buckets, budget and the serving
#   tests-multigpu     bench (serving); tensor parallelism and DDP, world 1, and world 2 on two GPUs (multigpu)
#   tests-fresh-inputs detectors and DETR-like models fed a fresh input each call, forwards that draw random numbers
#   tests-differential the differential runner on a handful of each library's models
#   tests-compiled     wrap, graphed_step and decode graphs with kernels="compiled": Inductor's programs compiled
#                      in a child process and swapped in
#   multigpu-bench     launchless bench --suite multigpu over GPUS (world size W on the first W)
#   serving-bench      launchless bench --suite serving (SERVING="workload ..." instead of the suite's workloads,
#                      SERVING_MODES="mode ..." only those modes: a part of it; launchless bench --merge joins parts;
#                      STEP_TIMEOUT=s ends it with SIGINT after s seconds, this folder still archived, its rows kept)
#   kernels-bench      launchless bench --suite kernels (KERNELS="workload ..." instead of the suite's workloads,
#                      KERNELS_MODES="mode ..." only those modes; TORCHINDUCTOR_COMPILE_THREADS reaches the compiler;
#                      STEP_TIMEOUT as for serving-bench)
#   training           launchless bench --suite training: the four training steps, all five modes, one run
#   train-epochs       launchless train, 20 epochs of the tiny set: eager twice, then --cuda-graph
#   standard-inference launchless bench --suite standard, its inference workloads only (training runs above)
#   compiler-tests     the compiler path's GPU tests only
#   compiler-inference launchless bench --suite compiler: the inference workloads, three compile modes
#   compiler-blocked   the same for the models a host copy keeps out of plain capture
#   compiler-suite     both sets (as ONLY leaves them) in one bench run, so that its GPUs share all of them
#   grace-bench        launchless bench --suite grace: eager, the compiler steps' modes, launchless and the race of
#                      the compiled modes in one process (or MODES), the workloads ONLY names or all of them (a suite
#                      split over device calls; --merge joins the parts)
#   evidence-bytes     launchless bench: bytes copied per call with and without pointer indirection (copy_bytes), on
#                      BYTES="workload ..." (default grace:deep-recommender@b256, a 200 MB input per call)
#   evidence-coverage  launchless bench: the share of kernels inside graphs (graph_coverage) of the blocked models,
#                      wrap against the compiler path without and with CGCT, dealt over the GPUs
#                      (COVER="name ..." instead of the blocked models and fasterrcnn_mobilenet)
#   profile            launchless bench --profile over the workloads DIAG="name ..." names, in the compiler steps'
#                      modes (MODES): where each call's time goes, recompiles logged
#   detector-host-reads benchmarks/detector_host_reads.py: Mask R-CNN, Keypoint R-CNN, SSDlite, SSD, RetinaNet and
#                      FCOS eager against wrap, their post-processing through torchvision's functions rewritten to
#                      wait for the GPU once
#   first-call         benchmarks/first_call_cost.py over FIRST="workload ...": wrap(kernels=...)'s first call by
#                      variant (eager, compiled, without the spare compiler, without the compile job), profiled
#   program-read       benchmarks/program_read_cost.py over READ="workload ..." (READ_TRAINING=1: training programs):
#                      a compiled program's read in the calls' process, its imports, profile and the calls it stalls
#   package-load       benchmarks/package_load.py: which AOTInductor packages load and run on this GPU (built three
#                      ways, loaded three ways, each load in a process of its own)
#   compile-cost       benchmarks/program_compile_cost.py over COST="workload ...": an inference program's compile,
#                      AOTInductor as the compiler process runs it against other settings and Inductor's own format
#                      (COST_VARIANTS="variant ..." only those; COST_NUMERICS=1 with eager's rounding, as decode steps)
#   fallback-cost      benchmarks/fallback_cost.py over FALLBACK="library:model ..." (differential names): a wrapped
#                      call that runs without a graph against eager -- host time, kernels, the wrapper's profile
#   differential       launchless differential run over LIBS="library:workers ..." side by side (default: all five
#                      populations, 14 workers) until DEADLINE seconds (540), resumable: rows go to RUNS/<library>
#                      (benchmarks/results/differential-runs), models with rows there already are left out, and
#                      the folder comes back in the archive; MODEL_TIMEOUT seconds a model (240)
#   differential-timing the timing pass over TIMING_LIBS="library ..." in turn, one process, until DEADLINE; resumable
#                      (ENTRIES="generate-greedy-b1": only those entry points, a model counted done once they are timed)
#   differential-timing-again  the timing pass again, one library after the other until DEADLINE, for the models AGAIN names
#                      (ENTRIES="wrap-auto wrap-true compile generate-greedy-b1": those entry points run again alone)
#   differential-again the models AGAIN="library:model,model ..." names run again (after a fix), a process per
#                      library side by side (PER_LIBRARY=n: n each); the merge keeps each model's newest line;
#                      ENTRIES="entry ..." runs only those entry points' rows (the merge replaces just those)
# GPUS="0 1" (default: every visible GPU) spreads the bench and coverage steps over those GPUs.
# ONLY="name ..." keeps only those workloads in the compiler steps (a suite split over device calls; --merge joins).
# MODES="mode ..." runs only those modes in the compiler steps (a re-run of one mode; --merge replaces its rows).
# BALANCE=bench.json deals the compiler steps' workloads over the GPUs by the time each took in that earlier run.
set -u
out=${1:?usage: device_run.sh OUT_DIR STEP [STEP ...]}
shift
mkdir -p "$out"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$(pwd)" PYTHONUNBUFFERED=1
# Bytecode kept where it can be written: the device's interpreter compiles every module it imports from source in
# every process otherwise (1.8 s of a compiled program's 4 s read there: Inductor's 550 modules), which no installed
# copy does (pip compiles them at install); the install step fills it before anything is timed
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="${PYTHONPYCACHEPREFIX:-${TMPDIR:-/tmp}/launchless-pycache}"
read -r -a gpus <<<"${GPUS:-$(python3 -c 'import torch; print(*range(torch.cuda.device_count()))')}"
read -r -a modes <<<"${MODES:-compile reduce-overhead launchless-compile}"  # the compiler steps' modes
balance=(${BALANCE:+--balance-from "$BALANCE"})
names() {  # the compiler suite's blocked (1) or inference (0) workloads
  python3 -c 'import sys; from launchless.apps.bench.workloads import COMPILER, suite
blocked, only = sys.argv[1] == "1", sys.argv[2].split()
print(*[w.name for w in suite(COMPILER) if (w.suites == (COMPILER,)) == blocked and (not only or w.name in only)])' \
    "$1" "${ONLY:-}"
}
read -r -a blocked <<<"$(names 1)"
read -r -a inference <<<"$(names 0)"
# coverage: the blocked models and fasterrcnn_mobilenet (in the standard suite too, blocked by the same copy)
read -r -a cover <<<"${COVER:-${blocked[*]} tv:fasterrcnn_mobilenet_v3_large_fpn}"

declare -A test_groups=(  # the cuda tests in groups of a few minutes each (the last needs two GPUs)
  [tests-core]="tests/test_cuda_coverage.py tests/test_cuda_runtime.py tests/hazards tests/test_cuda_bench.py
    tests/test_readme.py tests/test_cuda_region_split.py tests/test_cuda_compiler.py tests/test_cuda_train.py
    tests/test_trainer.py"
  [tests-serving]="tests/test_cuda_decoding.py tests/test_cuda_buckets.py tests/test_cuda_budget.py
    tests/test_cuda_bench_serving.py"
  [tests-compiled]="tests/test_cuda_compiled_kernels.py tests/test_cuda_train_compiled_kernels.py
    tests/test_cuda_decode_kernels.py"
  [tests-fresh-inputs]="tests/test_cuda_fresh_inputs.py tests/test_cuda_random_forwards.py"
  [tests-differential]="tests/test_cuda_differential.py"
  [tests-multigpu]="tests/test_cuda_multigpu.py tests/test_cuda_trainer_ddp.py tests/test_cuda_zoo_tensor_parallel.py
    tests/test_cuda_bench_multigpu.py"
)

run() {  # name, command...: its output to OUT_DIR/name.log, one line in steps.txt
  local name=$1 start=$SECONDS
  shift
  "$@" >"$out/$name.log" 2>&1
  echo "$name: exit $? after $((SECONDS - start)) s" | tee -a "$out/steps.txt"
}

differential() {  # the population side by side until DEADLINE, resumable; the rows folder comes back in the archive
  local runs=${RUNS:-benchmarks/results/differential-runs} spec lib
  for spec in ${LIBS:-transformers-causal:5 transformers:5 torchvision:2 timm:1 diffusers:1}; do
    lib=${spec%:*}
    mkdir -p "$runs/$lib"
    timeout "${DEADLINE:-540}" python3 -m launchless.apps.cli differential run --library "$lib" \
      --processes "${spec#*:}" --timeout "${MODEL_TIMEOUT:-240}" --resume --out "$runs/$lib" \
      >"$out/differential-$lib.log" 2>&1 &
  done
  wait
  mkdir -p "$out/differential-runs" && cp -r "$runs/." "$out/differential-runs/"
}

differential_again() {  # named models run again, a process per library; their new lines replace the old in the merge
  local runs=${RUNS:-benchmarks/results/differential-runs} spec lib models
  for spec in ${AGAIN:?AGAIN=\"library:model,model ...\" names the models to run again}; do
    lib=${spec%%:*} models=${spec#*:}
    mkdir -p "$runs/$lib"
    timeout "${DEADLINE:-540}" python3 -m launchless.apps.cli differential run --library "$lib" \
      --processes "${PER_LIBRARY:-1}" --timeout "${MODEL_TIMEOUT:-240}" --models ${models//,/ } --out "$runs/$lib" \
      ${ENTRIES:+--entries $ENTRIES} >"$out/differential-again-$lib.log" 2>&1 &
  done
  wait
  mkdir -p "$out/differential-runs" && cp -r "$runs/." "$out/differential-runs/"
}

differential_timing_again() {  # the timing pass again for the models AGAIN names, one library after the other, all
  # of them until DEADLINE (a device call cut at its limit returns nothing of the folder); the merge keeps the newest line
  local runs=${RUNS:-benchmarks/results/differential-runs} spec lib models left end=$((SECONDS + ${DEADLINE:-540}))
  for spec in ${AGAIN:?AGAIN=\"library:model,model ...\" names the models to time again}; do
    lib=${spec%%:*} models=${spec#*:}
    left=$((end - SECONDS))
    ((left > 10)) || break
    mkdir -p "$runs/$lib"
    timeout "$left" python3 -m launchless.apps.cli differential run --library "$lib" --timing \
      --timeout "${MODEL_TIMEOUT:-240}" --models ${models//,/ } --out "$runs/$lib" ${ENTRIES:+--entries $ENTRIES} \
      >>"$out/differential-timing.log" 2>&1
  done
  mkdir -p "$out/differential-runs" && cp -r "$runs/." "$out/differential-runs/"
}

differential_timing() {  # the timing pass, one library after the other, until DEADLINE
  local runs=${RUNS:-benchmarks/results/differential-runs} lib left end=$((SECONDS + ${DEADLINE:-540}))
  for lib in ${TIMING_LIBS:-transformers-causal transformers torchvision timm diffusers}; do
    left=$((end - SECONDS))
    ((left > 10)) || break
    mkdir -p "$runs/$lib"
    timeout "$left" python3 -m launchless.apps.cli differential run --library "$lib" --timing --resume \
      --timeout "${MODEL_TIMEOUT:-240}" --out "$runs/$lib" ${ENTRIES:+--entries $ENTRIES} \
      >>"$out/differential-timing.log" 2>&1
  done
  mkdir -p "$out/differential-runs" && cp -r "$runs/." "$out/differential-runs/"
}

for step in "$@"; do
  case $step in
  install)
    run install python3 -m pip install -e . --no-deps --no-build-isolation -q
    [ -n "${WHEELS:-}" ] && run install-wheels python3 -m pip install --no-deps -q "$WHEELS"/*.whl
    run install-bytecode python3 -c 'import importlib, contextlib
for name in ("launchless", "torch._inductor.compile_fx", "torch._inductor.standalone_compile", "torch.export",
             "torchvision.models", "timm", "transformers", "diffusers"):
    with contextlib.suppress(Exception):
        importlib.import_module(name)'
    run toolchain python3 -c 'import shutil, subprocess, torch.utils.cpp_extension as ext  # what AOTInductor builds with
print("CUDA_HOME", ext.CUDA_HOME, "| nvcc", shutil.which("nvcc"), "| c++", shutil.which("c++") or shutil.which("g++"))
print(subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout.count("libcuda.so"), "libcuda.so entries")' ;;
  tests) run tests python3 -m pytest -m cuda tests/ -q -rA -p no:cacheprovider ;;
  tests-core | tests-serving | tests-compiled | tests-fresh-inputs | tests-differential | tests-multigpu)
    run "$step" python3 -m pytest -m cuda -q -rA -p no:cacheprovider ${test_groups[$step]} ;;
  tests-alone)  # TESTS="file or file::test ..." (K="expression": pytest -k) in one process, alone on the GPU: the
    # speed-judging tests a side-by-side run failed, run again; TESTS_TIMEOUT seconds (none by default)
    read -r -a alone <<<"${TESTS:?tests-alone: set TESTS to the test files or node ids}"
    run tests-alone timeout -s INT "${TESTS_TIMEOUT:-0}" python3 -m pytest -m cuda -v -rfE -p no:cacheprovider \
      ${K:+-k "$K"} "${alone[@]}" ;;
  tests-at-once)  # the five groups as processes side by side on the one GPU: correctness, not timing; each test's
    # verdict on its own line (-v), so that a group ended by TESTS_TIMEOUT (seconds; none by default) says how far it got
    for group in tests-core tests-serving tests-compiled tests-fresh-inputs tests-differential; do
      run "$group" timeout "${TESTS_TIMEOUT:-0}" python3 -m pytest -m cuda -v -rA -p no:cacheprovider \
        ${test_groups[$group]} &
    done
    wait ;;
  multigpu-bench)
    run multigpu-bench python3 -m launchless.apps.cli bench --suite multigpu --gpus "${gpus[@]}" \
      --out "$out/multigpu-bench" ;;
  serving-bench)
    read -r -a serving <<<"${SERVING:-}"
    read -r -a serving_modes <<<"${SERVING_MODES:-}"
    run serving-bench timeout -s INT "${STEP_TIMEOUT:-0}" python3 -m launchless.apps.cli bench --suite serving \
      ${serving[@]:+--workloads "${serving[@]}"} ${serving_modes[@]:+--modes "${serving_modes[@]}"} \
      --out "$out/serving-bench" ;;
  kernels-bench)
    read -r -a kernels <<<"${KERNELS:-}"
    read -r -a kernels_modes <<<"${KERNELS_MODES:-}"
    run kernels-bench timeout -s INT "${STEP_TIMEOUT:-0}" python3 -m launchless.apps.cli bench --suite kernels \
      ${kernels[@]:+--workloads "${kernels[@]}"} ${kernels_modes[@]:+--modes "${kernels_modes[@]}"} --timeout 400 \
      --out "$out/kernels-bench" ;;
  compiler-tests) run compiler-tests python3 -m pytest -m cuda tests/test_cuda_compiler.py -q -rA -p no:cacheprovider ;;
  compiler-inference)
    ((${#inference[@]})) || { echo "compiler-inference: no workload left by ONLY" | tee -a "$out/steps.txt"; continue; }
    run compiler-inference python3 -m launchless.apps.cli bench --suite compiler --workloads "${inference[@]}" \
      --modes "${modes[@]}" --gpus "${gpus[@]}" --timeout 300 --out "$out/compiler-inference" "${balance[@]}" ;;
  compiler-blocked)
    ((${#blocked[@]})) || { echo "compiler-blocked: no workload left by ONLY" | tee -a "$out/steps.txt"; continue; }
    run compiler-blocked python3 -m launchless.apps.cli bench --suite compiler --workloads "${blocked[@]}" \
      --modes "${modes[@]}" --gpus "${gpus[@]}" --timeout 400 --out "$out/compiler-blocked" "${balance[@]}" ;;
  compiler-suite)
    all=("${inference[@]}" "${blocked[@]}")
    ((${#all[@]})) || { echo "compiler-suite: no workload left by ONLY" | tee -a "$out/steps.txt"; continue; }
    run compiler-suite python3 -m launchless.apps.cli bench --suite compiler --workloads "${all[@]}" \
      --modes "${modes[@]}" --gpus "${gpus[@]}" --timeout 400 --out "$out/compiler-suite" "${balance[@]}" ;;
  grace-bench)  # launchless too: graphed_step is the training rows' launchless (the compiler path graphs inference)
    read -r -a grace <<<"${ONLY:-}"
    read -r -a grace_modes <<<"${MODES:-compile reduce-overhead launchless-compile launchless raced}"
    run grace-bench python3 -m launchless.apps.cli bench --suite grace ${grace[@]:+--workloads "${grace[@]}"} \
      --modes eager "${grace_modes[@]}" --gpus "${gpus[@]}" --timeout 400 --out "$out/grace-bench" "${balance[@]}" ;;
  detector-host-reads)
    mkdir -p "$out/detector-host-reads"
    run detector-host-reads python3 benchmarks/detector_host_reads.py "$out/detector-host-reads/detectors.json" ;;
  fallback-cost)  # FALLBACK="library:model ..." (default: the two models whose eager fallback timed slower than eager)
    run fallback-cost python3 benchmarks/fallback_cost.py --out "$out/fallback-cost" \
      ${FALLBACK:-transformers:paligemma transformers:switch_transformers} ;;
  first-call)  # FIRST="workload ..." (default timm:resnet18); REPEATS (2) fresh processes per variant
    for w in ${FIRST:-timm:resnet18}; do
      run "first-call-${w//:/-}" python3 benchmarks/first_call_cost.py --workload "$w" --repeats "${REPEATS:-2}" \
        --out "$out/first-call"
    done ;;
  program-read)  # READ="workload ..." (default timm:resnet18); READ_TRAINING=1: their training programs
    for w in ${READ:-timm:resnet18}; do
      # the programs compiled for it kept outside the archive (megabytes that come back for nothing)
      run "program-read-${w//:/-}" python3 benchmarks/program_read_cost.py --workload "$w" --out "$out/program-read" \
        --cache "$(mktemp -d)" ${READ_TRAINING:+--training}
    done ;;
  package-load) run package-load python3 benchmarks/package_load.py --out "$out/package-load" ;;
  compile-cost)  # COST="workload ..." (default hf:gpt2); COST_VARIANTS="variant ..."; COST_NUMERICS=1: eager's rounding
    read -r -a cost_variants <<<"${COST_VARIANTS:-}"
    for w in ${COST:-hf:gpt2}; do
      run "compile-cost-${w//:/-}" python3 benchmarks/program_compile_cost.py --workload "$w" --out "$out/compile-cost" \
        ${cost_variants[@]:+--variants "${cost_variants[@]}"} ${COST_NUMERICS:+--eager-numerics}
    done ;;
  training)
    run training python3 -m launchless.apps.cli bench --suite training --timeout 300 --gpus "${gpus[@]}" \
      --modes eager compile reduce-overhead hand-graph launchless \
      --out "$out/training" ;;
  train-epochs)
    for r in eager eager2 graph; do
      flag=() && [[ $r == graph ]] && flag=(--cuda-graph)
      run "train-epochs-$r" python3 -m launchless.apps.cli train --model timm:resnet18 --tiny-data --epochs 20 \
        --batch 8 --out "$out/train-epochs/$r" "${flag[@]}"
    done ;;
  standard-inference)
    read -r -a standard <<<"$(python3 -c 'from launchless.apps.bench.workloads import STANDARD, suite
print(*[w.name for w in suite(STANDARD) if w.kind != "training"])')"
    run standard-inference python3 -m launchless.apps.cli bench --suite standard --workloads "${standard[@]}" \
      --gpus "${gpus[@]}" --timeout 300 --out "$out/standard-inference" ;;
  evidence-bytes)
    run evidence-bytes python3 -m launchless.apps.cli bench --suite grace --workloads ${BYTES:-grace:deep-recommender@b256} \
      --modes launchless-compile-no-pi launchless-compile --out "$out/evidence-bytes" ;;
  evidence-coverage)
    run evidence-coverage python3 -m launchless.apps.cli bench --suite compiler --workloads "${cover[@]}" \
      --modes launchless launchless-compile-no-cgct launchless-compile --gpus "${gpus[@]}" --out "$out/evidence-coverage" ;;
  profile)
    run profile env TORCH_LOGS=recompiles python3 -m launchless.apps.cli bench --suite compiler \
      --workloads ${DIAG:?DIAG=\"workload ...\" names the workloads to profile} --modes "${modes[@]}" --profile \
      --out "$out/profile" ;;
  differential) run differential differential ;;
  differential-timing) run differential-timing differential_timing ;;
  differential-again) run differential-again differential_again ;;
  differential-timing-again) run differential-timing-again differential_timing_again ;;
  *) echo "unknown step $step" | tee -a "$out/steps.txt" ;;
  esac
done
tar czf "$out.tgz" --exclude="*.pt" --exclude="tiny-data" -C "$(dirname "$out")" "$(basename "$out")"
cat "$out/steps.txt"
if [ -n "${OUT:-}" ] && [ -d "$OUT" ]; then  # on the device: the archive is what comes back, and only it
  if [ "$(cd "$(dirname "$out")" && pwd)" != "$(cd "$OUT" && pwd)" ]; then
    cp "$out.tgz" "$OUT/"
  else
    rm -rf "$out"  # a folder of many files under $OUT would come back cut short (a call returns a few files)
  fi
fi
