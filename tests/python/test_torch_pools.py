"""vmmshim's framework pools with PyTorch's caching allocator (modelled in
framework_models.py, over real shim memory on the simulated driver): no
allocation made while paused lands in paused memory; and a lost context
said in words. Each test failed on the code before the fix it covers."""
import ctypes
import unittest

from framework_models import (CONTEXTS, MIB, PoolsTest, _pools, cu,  # noqa: F401
                              random_pause_or_resume, touch, vmmshim)


class TorchPoolsTest(PoolsTest):
    def test_pausing_a_tag_leaves_other_pools_whole_and_its_free_space_unused(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):
            kv_live = self.holes(a)
        untagged_live = self.holes(a)
        kv_pool = a.blocks[kv_live[0]][0]
        self.assertNotEqual(kv_pool, (0, 0))  # the tag's own pool
        self.assertGreater(vmmshim.pause("kv"), 0)
        self.assertFalse(touch(kv_live[0], 256 * 1024))      # paused
        self.assertTrue(touch(untagged_live[0], 256 * 1024))  # not the default pool
        for _ in range(16):  # untagged work: the default pool, never kv's holes
            p = a.malloc(200 * 1024)
            self.assertTrue(touch(p, 200 * 1024))
        with vmmshim.tag("kv"):  # the paused tag: a pool of the block's own
            p = a.malloc(100 * 1024)
            self.assertNotEqual(a.blocks[p][0], kv_pool)
            self.assertTrue(touch(p, 100 * 1024))
        self.assertEqual(a.routes, [])  # no pause pool was needed
        self.assertGreater(vmmshim.resume("kv"), 0)
        self.assertTrue(touch(kv_live[0], 256 * 1024))
        with vmmshim.tag("kv"):  # the tag's pool again, holes and all
            self.assertEqual(a.blocks[a.malloc(1024)][0], kv_pool)

    def test_pausing_everything_routes_every_allocation_to_a_pause_pool(self):
        torch, a = self.with_torch()
        live = self.holes(a, n=16)
        self.assertTrue(torch.matmul())  # cuBLAS's workspace, in the default pool
        self.assertTrue(torch.capture())  # a graph: its RNG tensors, in the default pool
        kept_state = torch.cuda.default_generators[0].state
        with vmmshim.tag("weights"):
            weights = self.holes(a)
        self.assertGreater(vmmshim.pause(except_tags=["weights"], keep_contents=False), 0)
        self.assertFalse(touch(live[0], 256 * 1024))
        self.assertTrue(torch.matmul())  # a new workspace, from the pause pool
        self.assertTrue(torch.capture())  # the graph RNG state: a fresh one
        sizes = [512, 4096, 100 * 1024, 256 * 1024, 3 * MIB]
        made = [a.malloc(s) for s in sizes * 4]
        for p, s in zip(made, sizes * 4):
            self.assertTrue(touch(p, s), "an allocation landed in paused memory")
        for p in made[::2]:
            a.free(p)
        with vmmshim.tag("weights"):  # a tag that is not paused: its own pool
            w = a.malloc(1024)
            self.assertEqual(a.blocks[w][0], a.blocks[weights[0]][0])
        # A phase that fits only while paused, freed before the resume.
        big = a.malloc(40 * MIB)
        self.assertTrue(touch(big, 40 * MIB))
        a.free(big)
        pause_pool = a.blocks[made[1]][0]
        self.assertIn(pause_pool, a.pools)
        self.assertGreater(vmmshim.resume(), 0)
        # The pause pool's free segments went back before the resume; its
        # live blocks stay valid, and new allocations use the default pool.
        self.assertEqual(a.routes, [])
        self.assertNotIn(pause_pool, [r[0] for r in a.routes])
        self.assertTrue(all(seg < 40 * MIB for seg in a.pools[pause_pool].segments.values()))
        self.assertTrue(touch(made[1], sizes[1]))
        self.assertEqual(a.blocks[a.malloc(1024)][0], (0, 0))
        self.assertTrue(touch(live[0], 256 * 1024))
        # The kept RNG state is back, with the offset the paused time reached.
        self.assertIs(torch.cuda.default_generators[0].state, kept_state)
        self.assertEqual(kept_state.offset, 8)
        self.assertTrue(torch.capture())

    def test_a_resume_short_of_memory_gets_the_framework_cache_back(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):
            kv = a.malloc(32 * MIB)
        self.assertGreater(vmmshim.pause("kv"), 0)
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.assertEqual(cu.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total)), 0)
        # A phase in the untagged (unpaused) pool takes what the pause gave,
        # and stays in PyTorch's cache once freed.
        big = a.malloc(free.value - 16 * MIB)
        self.assertTrue(touch(big, 1 * MIB))
        a.free(big)
        self.assertGreater(vmmshim.resume("kv"), 0)
        self.assertTrue(touch(kv, 32 * MIB))
        self.assertFalse(any(seg > 64 * MIB for seg in a.pools[(0, 0)].segments.values()))

    def test_a_program_pool_that_ends_while_paused_ends_after_the_resume(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):  # makes the routing ready
            pass
        self.holes(a)
        vmmshim.pause()
        own = torch.cuda.MemPool()  # a phase in a pool of the program's own
        pid = own.id
        del own
        self.assertEqual(torch.crashes, [])
        self.assertNotIn(pid, torch.ended)  # kept while the pause pool is routed
        vmmshim.resume()
        self.assertIn(pid, torch.ended)
        self.assertEqual(torch.crashes, [])

    def test_a_thread_inside_a_tag_across_the_pause_gets_unpaused_memory(self):
        torch, a = self.with_torch()
        finish = self.in_tag_on_a_thread(
            "kv", lambda: self.holes(a),
            lambda: [touch(a.malloc(128 * 1024), 128 * 1024) for _ in range(8)])
        # Another thread in the same tag meanwhile: its own pool, no error.
        with vmmshim.tag("kv"):
            self.assertTrue(touch(a.malloc(4096), 4096))
        vmmshim.pause("kv")
        self.assertEqual(finish(), [True] * 8)
        vmmshim.resume("kv")
        self.assertEqual(a.routes, [])

    def test_nested_tags_captures_and_the_async_backend(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):
            with vmmshim.tag("kv"):  # nested: one route, no "already recording"
                self.assertEqual(len(a.routes), 1)
            with vmmshim.tag("w"):
                self.assertEqual(len(a.routes), 2)
            torch.capturing = True  # inside a capture the graph's pool takes them
            with vmmshim.tag("x"):
                self.assertEqual(len(a.routes), 1)
            torch.capturing = False
        self.assertEqual(a.routes, [])
        # backend:cudaMallocAsync: the shim is the allocator; nothing routed.
        self.setUp()
        torch, a = self.with_torch("cudaMallocAsync")
        with vmmshim.tag("kv"):
            self.assertEqual(a.routes, [])
        vmmshim.pause()
        self.assertEqual(a.routes, [])

    def test_an_allocation_during_the_pause_call_does_not_poison_the_pause_pool(self):
        torch, a = self.with_torch()
        self.holes(a)
        gap = []
        # Another thread's allocation between the routing and the shim's pause.
        self.call_with("vmmshim_pause_memory", lambda: gap.append(a.malloc(64 * 1024)))
        vmmshim.pause()
        a.free(gap[0])
        for _ in range(8):
            p = a.malloc(64 * 1024)
            self.assertTrue(touch(p, 64 * 1024), "an allocation landed in paused memory")

    def test_a_failed_pause_undoes_the_routing(self):
        torch, a = self.with_torch()
        self.holes(a)
        seen = []

        def fail():  # the shim's pause fails (a driver error), after the routing
            seen.append((len(a.routes), torch.cuda.default_generators[0].state))
            raise vmmshim.VmmshimError("vmmshim_pause_memory_except", 1)

        self.call_with("vmmshim_pause_memory_except", fail)
        kept = torch.cuda.default_generators[0].state
        with self.assertRaises(vmmshim.VmmshimError):
            vmmshim.pause(except_tags=["w"])
        self.assertEqual(seen[0][0], 1)               # the pause pool was routed
        self.assertIsNot(seen[0][1], kept)            # and the graph RNG swapped
        self.assertIs(torch.cuda.default_generators[0].state, kept)
        with self.assertRaises(ValueError):
            vmmshim.pause("kv", except_tags=["w"])
        self.assertEqual(a.routes, [])
        self.assertEqual(_pools._torch[1].paused, set())

    def test_a_pause_pool_that_served_a_tag_is_not_used_once_that_tag_is_paused(self):
        torch, a = self.with_torch()
        self.holes(a)
        finish = self.in_tag_on_a_thread(
            "kv", lambda: None,
            lambda: a.free(a.malloc(256 * 1024)))  # a kv segment in the pause pool
        vmmshim.pause()
        finish()
        vmmshim.pause("kv")  # pauses that segment, inside the pause pool
        for _ in range(8):
            p = a.malloc(200 * 1024)
            self.assertTrue(touch(p, 200 * 1024), "an allocation landed in paused memory")

    def test_a_block_of_its_own_is_paused_again_safely(self):
        torch, a = self.with_torch()
        with vmmshim.tag("kv"):
            a.malloc(4096)  # the tag's pool
        vmmshim.pause("kv")
        finish = self.in_tag_on_a_thread(  # a pool of its own: kv is paused
            "kv", lambda: a.free(a.malloc(256 * 1024)),
            lambda: [touch(a.malloc(200 * 1024), 200 * 1024) for _ in range(4)])
        vmmshim.resume("kv")
        vmmshim.pause("kv")  # the block's own pool holds kv memory: paused too
        self.assertEqual(finish(), [True] * 4)

    def test_nested_tags_keep_one_tag_per_pool(self):
        torch, a = self.with_torch()
        with vmmshim.tag("a"):
            with vmmshim.tag("b"):
                b = a.malloc(100 * 1024)
                with vmmshim.tag("a"):
                    inner = a.malloc(100 * 1024)
                with vmmshim.tag(None):
                    untagged = a.malloc(100 * 1024)
        self.assertNotEqual(a.blocks[inner][0], a.blocks[b][0])
        self.assertNotEqual(a.blocks[untagged][0], a.blocks[b][0])
        vmmshim.pause("b")
        self.assertFalse(touch(b, 100 * 1024))
        self.assertTrue(touch(inner, 100 * 1024))
        self.assertTrue(touch(untagged, 100 * 1024))
        self.assertEqual(a.routes, [])

    def test_every_device_with_a_context_is_routed(self):
        torch, a = self.with_torch(devices=2)
        a1 = torch.allocators[1]
        with torch.cuda.device(1):
            live = [a1.malloc(256 * 1024) for _ in range(4)]
            a1.free(live[0])
        with vmmshim.tag("kv"):  # current device 0; an allocation on device 1
            with torch.cuda.device(1):
                kv = torch.malloc(256 * 1024)
        self.assertNotEqual(a1.blocks[kv][0], (0, 0))  # the tag's pool on device 1
        vmmshim.pause("kv")
        cu.cuCtxSetCurrent(CONTEXTS[1])
        self.assertFalse(touch(kv, 256 * 1024))
        with torch.cuda.device(1):
            for _ in range(8):
                p = torch.malloc(200 * 1024)
                self.assertTrue(touch(p, 200 * 1024))
        cu.cuCtxSetCurrent(CONTEXTS[0])

    def test_pausing_everything_twice_keeps_the_graph_rng_state(self):
        torch, a = self.with_torch()
        self.holes(a)
        self.assertTrue(torch.capture())
        kept = torch.cuda.default_generators[0].state
        vmmshim.pause()
        self.assertTrue(torch.capture())
        vmmshim.pause()
        self.assertTrue(torch.capture())  # a fresh state again: the last one is paused
        vmmshim.resume()
        self.assertIs(torch.cuda.default_generators[0].state, kept)
        self.assertEqual(kept.offset, 12)

    def test_a_resume_that_fails_early_leaves_the_routing_as_it_was(self):
        torch, a = self.with_torch()
        finish = self.in_tag_on_a_thread("kv", lambda: a.malloc(4096), lambda: None)
        vmmshim.pause("kv")  # a thread in the tag: a pause pool
        finish()
        routes = list(a.routes)
        self.assertEqual(len(routes), 1)
        with self.assertRaises(TypeError):
            vmmshim.resume(b"kv")  # not a str
        self.assertEqual(a.routes, routes)
        self.assertEqual(_pools._torch[1].resuming, {})

    def test_a_lost_context_is_said_in_words(self):
        e = vmmshim.VmmshimError("vmmshim_resume_memory", 700)
        self.assertIn("CUDA_ERROR_ILLEGAL_ADDRESS", str(e))
        self.assertIn("the CUDA context is lost", str(e))
        self.assertEqual(e.code, 700)
        self.assertNotIn("context is lost", str(vmmshim.VmmshimError("x", 2)))


    def test_random_sequences_never_hand_out_paused_memory(self):
        """Random nestings of tags, allocations, frees, captures, pauses and
        resumes of every kind of selection: each allocation is writable when
        made, every block is writable after the final resume, and no route
        is left open."""
        import contextlib
        import random
        for seed in range(40):
            self.setUp()
            torch, a = self.with_torch(devices=2)
            rng = random.Random(seed)
            tags = contextlib.ExitStack()
            depth, live = 0, []
            for step in range(150):
                op = rng.random()
                where = f"seed {seed} step {step}"
                if op < 0.15 and depth < 4:
                    tags.enter_context(vmmshim.tag(rng.choice(["a", "b", None, "a"])))
                    depth += 1
                elif op < 0.25 and depth:
                    # Leave the innermost tag only: close and re-enter the rest.
                    tags.close()
                    tags, depth = contextlib.ExitStack(), 0
                elif op < 0.6:
                    device = rng.choice([0, 0, 1])
                    size = rng.choice([512, 4096, 100 * 1024, 300 * 1024])
                    with torch.cuda.device(device):
                        p = torch.malloc(size)
                    cu.cuCtxSetCurrent(CONTEXTS[device])
                    self.assertTrue(touch(p, size), f"{where}: paused memory handed out")
                    cu.cuCtxSetCurrent(CONTEXTS[0])
                    live.append((device, p))
                elif op < 0.75 and live:
                    device, p = live.pop(rng.randrange(len(live)))
                    torch.allocators[device].free(p)
                elif op < 0.77:
                    self.assertTrue(torch.capture(), f"{where}: the graph RNG state is paused")
                elif op < 0.8:
                    self.assertTrue(torch.matmul(), f"{where}: cuBLAS's workspace is paused")
                else:
                    random_pause_or_resume(rng, op)
            tags.close()
            vmmshim.resume()
            for device, p in live:
                cu.cuCtxSetCurrent(CONTEXTS[device])
                self.assertTrue(touch(p, 512), f"seed {seed}: a block lost after the resume")
            cu.cuCtxSetCurrent(CONTEXTS[0])
            self.assertEqual([x.routes for x in torch.allocators], [[], []], f"seed {seed}")
            self.tearDown()
            for x in torch.allocators:  # the next seed starts with the devices empty
                cu.cuCtxSetCurrent(CONTEXTS[x.device])
                for pool in x.pools.values():
                    for base in pool.segments:
                        self.assertEqual(cu.cuMemFree_v2(base), 0)
            cu.cuCtxSetCurrent(CONTEXTS[0])

if __name__ == "__main__":
    unittest.main()
