"""A helper process for tests/engine/test_helper_processes.py: answers the work it is given, as JSON."""
import json

from tftrt_py.engine.backends.cupy import helper_processes

print(json.dumps({"work": helper_processes.wait_for_work()}), flush=True)
