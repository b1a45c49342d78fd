"""sixbit's benchmarks: scripts that regenerate the project's claims, outside the library.

Run from the repository root as ``python -m benchmarks NAME [options]`` (``python -m benchmarks`` lists the
names; ``python -m benchmarks NAME --help`` the options). One module per benchmark, e.g.

* ``quality``          the ablation table on sixbit-mini (CPU, deterministic)
* ``speed``            speed and memory at real CogVideoX sizes, random weights (GPU)
* ``weights``          weight bytes at real sizes (CPU)
* ``memory``           whole-pipeline peak memory by phase (GPU)
* ``step_profile``     where a denoising step's GPU time goes (GPU)
* ``engine_defaults``  the presets' latent error on sixbit-mini: the numbers behind the default thresholds
* ``host_overhead``    sixbit's launch-wrapper CPU time per ``ops.linear`` call
* ``mini_train_step``  sixbit-mini training steps per second

``common`` holds what they share (environment, result files, statistics, configuration rows, the
random-weight CogVideoX pipeline). Every result is ``benchmarks/results/<name>.json`` + ``.md`` and names
its device, versions and exact command.
"""
