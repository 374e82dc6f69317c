"""The engine version this tree is (the lab's repository writes this file on each version's branch)."""

ENGINE = "0.6.6"
REVISION = 0  # a later lab commit on the same branch (engine.add_commit) counts up
