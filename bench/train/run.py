"""Run the trainer benchmarks one after the other: loader, encoder, shortlist.

    python bench/train/run.py
"""

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

if __name__ == "__main__":
    for script in ("loader.py", "encoder.py", "shortlist.py"):
        print(f"== {script}", flush=True)
        subprocess.run([sys.executable, str(HERE / script), *sys.argv[1:]], check=True)
