"""A math worker stub for the timeout test: hangs on the prediction "hang", else echoes
`[prediction == golds[0], prediction, ""]`."""

import json
import sys
import time

if __name__ == "__main__":
    for line in sys.stdin:
        pred, golds = json.loads(line)
        if pred == "hang":
            time.sleep(3600)
        sys.stdout.write(json.dumps([pred == golds[0], pred, ""]) + "\n")
        sys.stdout.flush()
