# decode-l2-hints-h100-2026-11-24.txt's run 2 through decode_variants.py, the drivers' common form (its records predate it
# and name the points (B, d, Hkv, Nk), Nq = 1). Run from the project root with the patched build in build/:
#   python3 docs/results/raw/decode_l2_hints.py OUT.jsonl ROUNDS
import os, subprocess, sys
pts = ['8,64,32,1,2048', '8,64,32,1,32768', '8,64,8,1,8192', '8,128,32,1,8192', '1,64,8,1,2048', '64,64,32,1,2048']
vars_ = ['base', 'ev:FA_EXP=2', 'ev-p0:FA_EXP=2,FA_EXP_PROMO=0', 'ev-p128:FA_EXP=2,FA_EXP_PROMO=2', 'ev.5:FA_EXP=6', 'ev.25:FA_EXP=10']
args = [a for p in pts for a in ('--point', p)] + [a for v in vars_ for a in ('--var', v)]
sys.exit(subprocess.call([sys.executable, os.path.join(os.path.dirname(__file__), 'decode_variants.py'), *sys.argv[1:3], *args]))
