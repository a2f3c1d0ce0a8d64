"""A deep sleep of a process whose earlier pauses mapped host VMM memory
(VMMSHIM_PAUSED_ACCESS=host): the driver's restore fails on a process that
holds any (Note [The driver's checkpoint and host VMM memory],
core/heap/host_mapped_pool.h), so the sleep must release all of it, the
scratch that a pause without contents kept included.

  kept     a tag paused with contents when the sleep comes: refused, naming
           the program's own pause, and the process goes on
  dropped  a tag paused without contents and resumed before the sleep (the
           scratch granule made and kept): sleeps and wakes, contents intact
  none     no pause before the sleep: sleeps and wakes, contents intact

Prints "sleep-after-paused-access MODE: ..." and exits 1 on a wrong outcome.
usage: LD_PRELOAD=libvmmshim.so VMMSHIM_HOST_POOL_MAKE=pause python3 sleep_after_paused_access.py MODE"""
import sys

import torch

import vmmshim


def main():
    mode = sys.argv[1]
    with vmmshim.tag("kv"):
        kv = torch.arange(1 << 26, device="cuda", dtype=torch.float32)
    with vmmshim.tag("tmp"):
        torch.ones(1 << 20, device="cuda")
    expected = float(kv.sum())
    torch.cuda.synchronize()
    if mode == "kept":
        vmmshim.pause("kv")
        try:
            vmmshim.sleep()
        except vmmshim.SleepError as e:
            vmmshim.resume("kv")
            ok = "paused of its own" in str(e) and float(kv.sum()) == expected
            print(f"sleep-after-paused-access kept: refused ({e}); "
                  f"{'intact' if ok else 'DIFFERS'}", flush=True)
            return 0 if ok else 1
        print("sleep-after-paused-access kept: the sleep was not refused", flush=True)
        vmmshim.wake()
        return 1
    if mode == "dropped":
        vmmshim.pause("tmp", keep_contents=False)
        vmmshim.resume("tmp")
    slept = vmmshim.sleep()
    woke = vmmshim.wake()
    ok = float(kv.sum()) == expected
    print(f"sleep-after-paused-access {mode}: {slept} / {woke}; {'intact' if ok else 'DIFFERS'}",
          flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
