"""GPU diagnosis of one model's training step: graphs run eagerly (and why), peak memory, and a kernel-time
profile (torch profiler, 3 steps).  python scripts/profile_model.py gpt2 tritonfuse|inductor"""
import logging, sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from scripts import model_zoo as mz
import tritonfuse
from tritonfuse import metrics
logging.basicConfig(level=logging.WARNING)
name, backend = sys.argv[1], sys.argv[2]
spec = mz.MODELS_BY_NAME[name]
dev = torch.device("cuda")
step, _ = mz.make_step(spec, "train", dev, torch.bfloat16)
batch = mz.make_batch(spec, "train", dev, torch.bfloat16)
f = torch.compile(step, backend=backend)
t = time.time()
for _ in range(3):
    loss = f(batch); loss.backward()
torch.cuda.synchronize()
print(f"== {name} {backend} partitioner={tritonfuse.config.partitioner}: first 3 steps {time.time()-t:.1f} s, eager graphs {metrics.eager_graphs}, peak MB {torch.cuda.max_memory_allocated()/2**20:.0f}")
for g, why in metrics.eager_graph_reasons.items():
    print("EAGER", g, why)
from torch.profiler import profile, ProfilerActivity
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(3):
        loss = f(batch); loss.backward()
    torch.cuda.synchronize()
ev = prof.key_averages()
tot = sum(e.self_device_time_total for e in ev) / 3 / 1000
print(f"total device ms/step {tot:.2f}; kernels/step {sum(e.count for e in ev)/3:.0f}")
for e in sorted(ev, key=lambda e: -e.self_device_time_total)[:22]:
    print(f"{e.self_device_time_total/3/1000:7.3f} ms {e.count//3:4d}x  {e.key[:110]}")
