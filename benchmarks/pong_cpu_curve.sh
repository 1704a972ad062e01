#!/usr/bin/env bash
# The CPU Atari runs' curves as far as they went: benchmarks/results/{pong,breakout}_cpu_bf16*.json and .png
# (see pong_curve.py), then the table and a figure per game (atari_table.py).
# The run: seed 1 of the Atari preset with 25k-step evaluations and checkpoints, stopped and continued with --resume;
# its first two processes (to steps 31,856 and 34,184) logged no wall time, so their segments are given.
cd "$(dirname "$0")/.."
python benchmarks/pong_curve.py runs/PongNoFrameskip-v4__per_dqn__cpu_bf16__1 --name pong_cpu_bf16 \
  --command "python algos/per_dqn.py --env PongNoFrameskip-v4 --eval-frequency 25000 --checkpoint-frequency 25000 --stop-return 18 --run-name PongNoFrameskip-v4__per_dqn__cpu_bf16__1, continued with --resume RUN_DIR" \
  --machine "2-vCPU AMD EPYC VM (avx512_bf16, no AMX), torch 2.13.0 CPU: bf16 autocast, 2 threads, 8 envs, shared with other jobs" \
  --segments 0:0 31856:668 34184:695
# Seeds 2 and 3, on a 2-vCPU Intel Xeon with AMX, one torch thread (other jobs used the second core), continued with
# --resume. Seed 2 computed with subnormal floats kept to step 240,000 (the code then) and flushed to zero after it.
python benchmarks/pong_curve.py runs/PongNoFrameskip-v4__per_dqn__cpu_bf16__2 --name pong_cpu_bf16_2 \
  --command "python algos/per_dqn.py --env PongNoFrameskip-v4 --seed 2 --eval-frequency 25000 --checkpoint-frequency 25000 --stop-return 18 --threads 1 --run-name PongNoFrameskip-v4__per_dqn__cpu_bf16__2, continued with --resume RUN_DIR" \
  --machine "2-vCPU Intel Xeon VM (amx_bf16), torch 2.13.0 CPU: bf16 autocast, 1 thread, 8 envs, the other core shared with other jobs, subnormals flushed from step 240,000"
python benchmarks/pong_curve.py runs/PongNoFrameskip-v4__per_dqn__cpu_bf16__3 --name pong_cpu_bf16_3 \
  --command "python algos/per_dqn.py --env PongNoFrameskip-v4 --seed 3 --eval-frequency 25000 --checkpoint-frequency 25000 --stop-return 18 --threads 1 --run-name PongNoFrameskip-v4__per_dqn__cpu_bf16__3, continued with --resume RUN_DIR" \
  --machine "2-vCPU Intel Xeon VM (amx_bf16), torch 2.13.0 CPU: bf16 autocast, 1 thread, 8 envs, the other core used by other jobs part of the time"
# Breakout, seeds 1 and 2 to 1M agent steps, on a 2-vCPU Intel Xeon with AMX, continued with --resume: one torch
# thread while other jobs used the second core, two (--resume RUN_DIR --threads 2) while the run had both.
threads_1="1 thread to step 111,984, then 2 threads, the run alone on both cores"
threads_2="1 thread to step 48,352, 2 threads to 197,496 (the run alone on both cores), 1 thread to 650,000 beside the 1M-buffer run below, then 2 threads alone"
for seed in 1 2; do
  [ -d runs/BreakoutNoFrameskip-v4__per_dqn__cpu_bf16__$seed ] || continue
  threads_var=threads_$seed
  python benchmarks/pong_curve.py runs/BreakoutNoFrameskip-v4__per_dqn__cpu_bf16__$seed --name breakout_cpu_bf16_$seed \
    --command "python algos/per_dqn.py --env BreakoutNoFrameskip-v4 --seed $seed --eval-frequency 50000 --checkpoint-frequency 50000 --threads 1 --run-name BreakoutNoFrameskip-v4__per_dqn__cpu_bf16__$seed, continued with --resume RUN_DIR [--threads 2]" \
    --machine "2-vCPU Intel Xeon VM (amx_bf16), torch 2.13.0 CPU: bf16 autocast, ${!threads_var}, 8 envs"
done
# What holds Breakout: seeds 1 and 2 again with a 1M-transition replay buffer, the preset otherwise (rows of the table
# whose settings say --buffer-size 1000000). Seed 1's steps are those of the preset's seed 1 until the preset's 100k
# buffer first wraps.
# Each seed's own flags, as it was started, and its threads over the run.
buffer_flags_1="--checkpoint-frequency 0 --threads 1"
buffer_flags_2="--checkpoint-frequency 250000 --threads 2"
buffer_threads_1="1 thread to step 456,288 beside Breakout seed 2, then 2 threads alone"
buffer_threads_2="2 threads, 1 from step 99,744 to 235,320 (tests on the other core); resumed alone at 701,352"
for seed in 1 2; do
  [ -d runs/BreakoutNoFrameskip-v4__per_dqn__buffer1M__$seed ] || continue
  flags_var=buffer_flags_$seed
  threads_var=buffer_threads_$seed
  python benchmarks/pong_curve.py runs/BreakoutNoFrameskip-v4__per_dqn__buffer1M__$seed --name breakout_buffer1M_$seed \
    --command "python algos/per_dqn.py --env BreakoutNoFrameskip-v4 --seed $seed --buffer-size 1000000 --eval-frequency 50000 ${!flags_var} --run-name BreakoutNoFrameskip-v4__per_dqn__buffer1M__$seed, continued with --resume RUN_DIR [--threads N]" \
    --machine "2-vCPU Intel Xeon VM (amx_bf16), torch 2.13.0 CPU: bf16 autocast, ${!threads_var}, 8 envs"
done
# Every Atari curve in one table and a figure per game.
python benchmarks/atari_table.py
