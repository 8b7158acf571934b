"""Host time of one model's training step on the GPU: wall per step and a cProfile of 10 steps.
    python scripts/host_profile_model.py gpt2 tritonfuse|inductor"""
import cProfile, pstats, sys, time, torch
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1]))
from scripts import model_zoo as mz
name, backend = sys.argv[1], sys.argv[2]
spec = mz.MODELS_BY_NAME[name]
dev = torch.device("cuda")
step, _ = mz.make_step(spec, "train", dev, torch.bfloat16)
batch = mz.make_batch(spec, "train", dev, torch.bfloat16)
f = torch.compile(step, backend=backend)
def run(n):
    for _ in range(n):
        loss = f(batch); loss.backward()
run(3); torch.cuda.synchronize()
t = time.perf_counter(); run(20); torch.cuda.synchronize()
print(f"== {name} {backend}: {1000*(time.perf_counter()-t)/20:.3f} ms/step wall (sync at the end only)")
# host only: time to issue the step when the GPU is not the bottleneck shows in the profile's totals
pr = cProfile.Profile(); pr.enable(); run(10); torch.cuda.synchronize(); pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(28)
