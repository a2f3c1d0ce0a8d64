"""vmmshim's framework pools with CuPy's default pool (modelled in
framework_models.py, over real shim memory on the simulated driver), and the
warning naming allocators the shim cannot see into."""
import os
import sys
import types
import unittest
import warnings

from framework_models import (MIB, PoolsTest, _pools, make_cupy, make_torch,
                              random_pause_or_resume, touch, vmmshim)


class CupyPoolsTest(PoolsTest):
    def test_cupy_default_pool(self):
        cupy = make_cupy()
        sys.modules["cupy"] = cupy
        default = cupy.get_default_memory_pool()
        live = [cupy.alloc(256 * 1024) for _ in range(8)]
        with vmmshim.tag("kv"):
            kv = [cupy.alloc(256 * 1024) for _ in range(8)]
        self.assertIsNot(kv[0].pool, default)  # the tag's own pool
        for p in live[::2] + kv[::2]:
            p.free()
        self.assertGreater(vmmshim.pause(), 0)
        ptr, size = cupy.workspaces[7]  # cuBLAS works in unpaused memory
        self.assertTrue(touch(ptr, size))
        made = [cupy.alloc(s) for s in (512, 100 * 1024, 256 * 1024, 3 * MIB)]
        self.assertTrue(all(touch(p.ptr, p.size) for p in made))
        self.assertTrue(all(p.pool is not default for p in made))
        with vmmshim.tag("kv"):
            k = cupy.alloc(256 * 1024)
            self.assertIsNot(k.pool, kv[0].pool)
            self.assertTrue(touch(k.ptr, k.size))
        big = cupy.alloc(40 * MIB)
        self.assertTrue(touch(big.ptr, big.size))
        big.free()
        pause_pool = made[0].pool
        self.assertGreater(vmmshim.resume(), 0)
        self.assertEqual(list(pause_pool.pool.segments.values()).count(40 * MIB), 0)
        # What was made while paused stays valid (its pool is kept), and so
        # does cuBLAS's workspace.
        del pause_pool
        self.assertTrue(all(touch(p.ptr, p.size) for p in made))
        self.assertTrue(touch(*cupy.workspaces[7]))
        self.assertIs(cupy.alloc(1024).pool, default)
        with vmmshim.tag("kv"):
            self.assertIs(cupy.alloc(1024).pool, kv[0].pool)
        self.assertTrue(touch(live[1].ptr, live[1].size))

    def test_cupy_pausing_everything_twice(self):
        cupy = make_cupy()
        sys.modules["cupy"] = cupy
        with vmmshim.tag("w"):
            cupy.alloc(1024)  # the allocator takes the default pool's place
        vmmshim.pause()
        first = [cupy.alloc(100 * 1024) for _ in range(4)]
        first[0].free()
        vmmshim.pause()  # the first pause pool is paused too now
        again = [cupy.alloc(100 * 1024) for _ in range(4)]
        self.assertTrue(all(touch(p.ptr, p.size) for p in again))
        self.assertFalse(touch(first[1].ptr, first[1].size))
        vmmshim.resume()
        self.assertTrue(all(touch(p.ptr, p.size) for p in first[1:] + again))

    def test_allocators_the_shim_cannot_see_into_are_named_once(self):
        sys.modules["jax"] = types.ModuleType("jax")
        os.environ.pop("XLA_PYTHON_CLIENT_ALLOCATOR", None)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            vmmshim.pause("nothing-has-this-tag")
            vmmshim.pause("nothing-has-this-tag")
        messages = [str(w.message) for w in seen]
        self.assertEqual(len(messages), 1, messages)
        self.assertIn("JAX's BFC arena", messages[0])
        self.assertIn("XLA_PYTHON_CLIENT_ALLOCATOR=cuda_async", messages[0])
        self.assertEqual(seen[0].filename, __file__)
        os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"] = "cuda_async"
        try:
            self.assertEqual(_pools.unsafe_allocators(), [])
        finally:
            del os.environ["XLA_PYTHON_CLIENT_ALLOCATOR"]
        # A PyTorch whose caching allocator cannot be routed.
        torch = make_torch()
        del torch._C._cuda_beginAllocateToPool
        sys.modules["torch"] = torch
        sys.modules.pop("jax")
        _pools._torch = None
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            vmmshim.pause("nothing-has-this-tag")
        self.assertEqual(len(seen), 1)
        self.assertIn("no MemPool routing", str(seen[0].message))
        self.assertIn("backend:cudaMallocAsync", str(seen[0].message))
        sys.modules.pop("torch")
        sys.modules["jax"] = types.ModuleType("jax")
        # A CuPy allocator of the program's own.
        cupy = make_cupy()
        own = cupy.cuda.MemoryPool()
        cupy.cuda.set_allocator(own.malloc)
        sys.modules["cupy"] = cupy
        sys.modules.pop("jax")
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            vmmshim.pause("nothing-has-this-tag")
        self.assertEqual(len(seen), 1)
        self.assertIn("a CuPy allocator of the program's own", str(seen[0].message))


    def test_random_sequences_never_hand_out_paused_memory(self):
        """Random tags, allocations, frees, pauses and resumes: each
        allocation is writable when made, and every block after the final
        resume."""
        import contextlib
        import random
        for seed in range(30):
            self.setUp()
            cupy = make_cupy()
            sys.modules["cupy"] = cupy
            # No cuBLAS workspace (32 MiB a pause) in a 256 MiB device here.
            sys.modules.pop("cupy_backends.cuda.libs.cublas")
            del sys.modules["cupy_backends.cuda.libs"].cublas
            rng = random.Random(seed)
            tags, depth, live = contextlib.ExitStack(), 0, []
            for step in range(150):
                op = rng.random()
                if op < 0.15 and depth < 3:
                    tags.enter_context(vmmshim.tag(rng.choice(["a", "b", None])))
                    depth += 1
                elif op < 0.25 and depth:
                    tags.close()
                    tags, depth = contextlib.ExitStack(), 0
                elif op < 0.65:
                    size = rng.choice([512, 4096, 64 * 1024, 100 * 1024])
                    p = cupy.alloc(size)
                    self.assertTrue(touch(p.ptr, size),
                                    f"seed {seed} step {step}: paused memory handed out")
                    live.append(p)
                elif op < 0.8 and live:
                    live.pop(rng.randrange(len(live))).free()
                else:
                    random_pause_or_resume(rng, op)
            tags.close()
            vmmshim.resume()
            for p in live:
                self.assertTrue(touch(p.ptr, 512), f"seed {seed}: a block lost after the resume")
            for p in live:
                p.free()
            self.tearDown()
            pools = _pools._cupy
            for pool in [pools.default] + pools.untagged + [
                    q for qs in pools.tagged.values() for q in qs]:
                pool.free_all_blocks()

if __name__ == "__main__":
    unittest.main()
