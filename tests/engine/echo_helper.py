"""A helper process for tests/engine/test_helper_processes.py: answers the work it is given, as JSON."""
import json

from tftrt_py.engine.backends.cupy import helpers

print(json.dumps({"work": helpers.wait_for_work()}), flush=True)
