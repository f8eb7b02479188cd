"""The benchmark behind `gradbridge bench`: Java-driven training against eager Python and a native libtorch loop.

One run, one machine, one table. Per training step, for each model:

  (a) eager PyTorch + torch.optim                 (b) Python calling the scripted module's train_step
  (c) Java calling train_step per batch           (d) Java calling train_epoch (one native call per epoch)
  (e) native C++ loop calling train_step          (e') native C++ loop calling train_epoch

(c) and (d) are timed by loops inside a JVM of their own (dev.gradbridge.bench.StepBenchmark),
as a Java service would run, on the pip wheel's libtorch, the same binary that (a), (b) and (e)
use; (c*) and (d*) are the same loops in this Python process through JPype. (e) is
benchmarks/native/train_loop.cpp, compiled against the pip wheel's libtorch. Every variant runs
the same .pt with the graph executor's optimizations off, autograd on, and the same intra-op
thread count.

The variants in processes of their own are *workers*: started and warmed up once, then asked
for one block of calls per round. Every variant runs one block per round, in an order shuffled
per round, so load on the machine hits all alike; a ratio between two variants is the median
of its per-round ratios with a bootstrap interval over rounds, and a target is met, missed, or
"cannot tell at this noise" when the interval straddles it (raise --rounds). Each block also
records what it cost its process: page faults, context switches and CPU seconds per step.

Also measured: numpy -> Java -> libtorch transfer, start-up, and resident memory over many Java
steps. Nothing here is asserted by tests.

Modules: ``stats`` (ratios, intervals, verdicts), ``workers`` (variants, processes of their own,
rounds, /proc counters), ``cases`` (the models and what is timed), ``memory`` (the plateau check),
``online`` (the online learner's throughput), ``report`` (targets, tables, chart), ``runner``
(``run``, every benchmark into bench.json and bench.png).
"""

from .runner import run
from .workers import JavaSettings

__all__ = ["run", "JavaSettings"]
