#!/usr/bin/env python3
# FlashAttention, step by step — docs/bench/wgmma_order.py: where ptxas put step 7's wgmma waits, read from a cubin.
#
#   docs/bench/wgmma_order.py CUBIN [SUBSTRING ...]
#
# For each kernel of an sm_90a cubin whose name contains every SUBSTRING, its number of SASS instructions (the
# whole kernel: a change to the loop shows there too), then the order of its wgmma waits and exp2s,
# compressed: "W1" is a WARPGROUP.DEPBAR (wgmma.wait_group) that lets one commit group stay in flight, "W0"
# one that waits for all, "M66" 66 MUFU instructions (the softmax's exp2; two per trip are the rescale factors).
# 7c's loop as written is "W1 M.. W0": the softmax between the wait for S_n and the wait for P_{n-1} V_{n-1},
# so that it runs under the latter; "W1 W0 M.." means ptxas moved the second wait above it.
# It needs no cuobjdump (the GPU machine has one; a developer's machine may not): it reads the ELF sections and
# two instruction encodings of sm_90, found by compiling one-instruction probes: the opcode field (bits 0-11)
# 0x9c5 with bit 47 set is WARPGROUP.DEPBAR.LE, its group count in bits 72-77; MUFU has 0x108 in bits 0-8.
#
# A cubin of one translation unit, from the build's own compile command:
#   cmd=$(cd build && ninja -t commands step7_hopper_wgmma/CMakeFiles/fa_step7.dir/instances_bf16_d128.cu.o | tail -1)
#   (cd build && eval "$(echo "$cmd" | sed 's/ -MD -MT [^ ]* -MF [^ ]*//; s# -o [^ ]*\.o# -o /tmp/d128.cubin#; s# -c # -cubin #')")
#   docs/bench/wgmma_order.py /tmp/d128.cubin forward_7c
import re
import struct
import sys


def fail(why):
    print(f"wgmma_order.py: {why}", file=sys.stderr)
    sys.exit(2)


def text_sections(path):
    """The .text.<kernel> sections of an ELF64 cubin: {kernel name: bytes}."""
    try:
        b = open(path, "rb").read()
    except OSError as e:
        fail(f"cannot read {path}: {e.strerror}")
    if b[:4] != b"\x7fELF" or len(b) < 0x40 or b[4] != 2:
        fail(f"{path} is not an ELF64 cubin (compile with -cubin)")
    shoff = struct.unpack_from("<Q", b, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", b, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", b, shoff + i * shentsize) for i in range(shnum)]
    names = headers[shstrndx][4]

    def name(off):
        return b[names + off:b.index(b"\0", names + off)].decode()

    return {name(h[0])[6:]: b[h[4]:h[4] + h[5]] for h in headers if name(h[0]).startswith(".text.")}


def order(code):
    seq, mufu = [], 0
    for i in range(0, len(code), 16):
        lo, hi = struct.unpack_from("<QQ", code, i)
        if lo & 0xFFF == 0x9C5 and (lo >> 47) & 1:  # WARPGROUP.DEPBAR.LE gsb0, n
            if mufu:
                seq.append(f"M{mufu}")
                mufu = 0
            seq.append(f"W{(hi >> 8) & 0x3F}")
        elif lo & 0x1FF == 0x108:  # MUFU
            mufu += 1
    if mufu:
        seq.append(f"M{mufu}")
    return " ".join(seq)


def short(kernel):
    m = re.search(r"forward_(7[a-d]).*HopperTilesELi(\d+)ELi(\d+)ELi(\d+)ELNS0_6DesignE\dELi(\d+)", kernel)
    if not m:
        return kernel[:70]
    blocks = f"-{m.group(5)}perSM" if m.group(5) != "0" else ""
    return f"{m.group(1)}-Br{m.group(2)}-Bc{m.group(3)}-S{m.group(4)}{blocks}"


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: wgmma_order.py CUBIN [SUBSTRING ...]  (see the file's header)")
        sys.exit(0 if len(sys.argv) > 1 else 2)
    for kernel, code in sorted(text_sections(sys.argv[1]).items()):
        if all(s in kernel for s in sys.argv[2:]):
            print(f"{short(kernel):28s} {len(code) // 16:5d}  {order(code)}")


if __name__ == "__main__":
    main()
