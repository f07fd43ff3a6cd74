"""The start-up profile (profiler.profile_forward) against a fake runner with a scripted clock:
flat 10 ms up to 4 tokens, then 2 ms per token, plus a slow spell of 2.5 or 5 ms in each of the
first 4 forwards of the token counts listed. Prints the fitted T(n) in ms at 1, 2, 3, 4, 6, 8."""
from types import SimpleNamespace
from specserve.spec_decode import profiler
class R:
    block_size, num_blocks = 16, 4096
    cfg = SimpleNamespace(max_position=8192)
    def __init__(self, spell_pts, spell, calls):
        self.now = 0.0; self.spell_pts = spell_pts; self.spell = spell; self.calls = dict.fromkeys(spell_pts, calls)
    def clock(self): return self.now
    def prepare(self, shape): return sum(q for _, q in shape)
    def execute(self, n, rows):
        self.now += 0.010 + 0.002 * max(n - 4, 0)
        if self.calls.get(n, 0) > 0:
            self.calls[n] -= 1; self.now += self.spell
for pts in [(2,), (2, 3), (2, 3, 4), (2, 3, 4, 6), (3, 4, 6)]:
    for spell in (0.0025, 0.005):
        r = R(pts, spell, 4)
        profiler.time.perf_counter = r.clock
        m = profiler.profile_forward(r, long_context=96)
        print(pts, spell, [round(float(m(n)) * 1e3, 2) for n in (1, 2, 3, 4, 6, 8)])
