"""Several Python threads on one model: inference runs on a vitc_session
per thread (no lock in the binding, ctypes releases the GIL), and every
result must equal the same call made serially, bit for bit; in fp32 and
bf16, mixing m(x), embed (every pool), forward_features and attention_maps,
batch sizes and image sizes (position resampling). Weights written through
state_dict() are packed again before the threads' next calls, and training
mode still records for backward.
"""
import threading
import unittest

import numpy as np

import vitc

SIZES = [(32, 32), (24, 40), (48, 32), (16, 16)]


def make_model(precision="fp32", seed=1):
    m = vitc.Model(image_size=32, patch_size=4, num_layers=2, num_heads=4, hidden_dim=32,
                   mlp_dim=64, num_classes=10, seed=seed)
    rng = np.random.default_rng(seed)
    sd = m.state_dict()
    for k, v in sd.items():  # torchvision zero-initialises the head
        if k.startswith("heads."):
            sd[k] = rng.standard_normal(v.shape).astype(np.float32) * 0.1
    m.load_state_dict(sd)
    m.precision = precision
    return m


def make_calls(seed=0):
    rng = np.random.default_rng(seed)
    calls = []
    kinds = ["call", "embed:cls", "embed:mean", "embed:tokens", "features", "maps"]
    for i in range(12):
        H, W = SIZES[i % len(SIZES)]
        x = rng.standard_normal((1 + i % 3, 3, H, W)).astype(np.float32)
        calls.append((kinds[i % len(kinds)], x))
    return calls


def run(m, call):
    kind, x = call
    if kind == "call":
        return [m(x)]
    if kind.startswith("embed:"):
        return [m.embed(x, pool=kind[6:])]
    if kind == "features":
        return [m.forward_features(x)]
    return list(m.attention_maps(x))


class TestSessions(unittest.TestCase):
    def threads_equal_serial(self, m, calls, nthreads=4, per_thread=25):
        ref = [run(m, c) for c in calls]
        bad, errors = [], []

        def work(t):
            try:
                for i in range(per_thread):
                    j = (i * 5 + t * 3) % len(calls)
                    got = run(m, calls[j])
                    if not all(np.array_equal(a, b) for a, b in zip(got, ref[j])):
                        bad.append((t, i, calls[j][0]))
            except Exception as e:  # reported below, in the main thread
                errors.append(repr(e))

        th = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
        for t in th:
            t.start()
        for t in th:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(bad, [], "results that differ from the serial ones")
        return ref

    def test_fp32(self):
        m = make_model()
        self.threads_equal_serial(m, make_calls())

    def test_bf16(self):
        m = make_model("bf16", seed=2)
        m.attention_precision = "bf16"
        self.threads_equal_serial(m, make_calls(1))

    def test_weights_changed_then_threads(self):
        """New weights (stale packs): the threads' calls pack them once and
        see them, equal to a fresh model with those weights."""
        for prec in ("fp32", "bf16"):
            m = make_model(prec, seed=3)
            calls = make_calls(2)
            before = run(m, calls[0])
            other = make_model(prec, seed=4)
            m.load_state_dict(other.state_dict())
            self.assertFalse(vitc._lib.lib.vitc_vit_is_prepared(m._h))
            ref = self.threads_equal_serial(m, calls)
            self.assertFalse(np.array_equal(before[0], ref[0][0]))
            for c, r in zip(calls, ref):
                for a, b in zip(run(other, c), r):
                    np.testing.assert_array_equal(a, b)

    def test_training_still_records(self):
        m = make_model(seed=5)
        x = make_calls(3)[0][1]
        y0 = m(x)
        m.train()
        y = m(x)
        m.backward(np.ones_like(y))
        self.assertTrue(any(np.any(g != 0) for g in m.grads().values()))
        m.eval()
        np.testing.assert_array_equal(m(x), y0)


if __name__ == "__main__":
    unittest.main()
