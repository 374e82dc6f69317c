"""Cache plugin `sparkfleet.cluster.facts`: the fact cache of ansible.cfg, as plain JSON files per host,
held in memory as plain dictionaries while a run lasts.

Why not `ansible.builtin.jsonfile`: ansible-core 2.19 wraps every persistent cache plugin in an
interposer that keeps each host's facts as an encoded JSON string and decodes it again, with its
tag-aware decoder, on every read; the VariableManager reads a host's facts once per task. With the
facts a run caches (tagged values: the validate action's verdict, gathered facts), that decode took about
28 ms of the controller's single thread per task and node on an idle machine, about a third of a no-op TP3
run (measured: bench/bench_runs.py; README, "Speed").
This plugin says it is not persistent (`_persistent = False`, the flag ansible-core's base class
documents for plugins that bypass the JSON serialization wrapper), so the loader does not wrap it;
it persists all the same: the file layer of ansible-core's own BaseFileCacheModule (expiry by
`fact_caching_timeout`, one file per host under `fact_caching_connection`) with plain JSON.
"""

from __future__ import annotations

import json
from pathlib import Path

from ansible.module_utils.common.json import AnsibleJSONEncoder
from ansible.plugins.cache import BaseFileCacheModule

DOCUMENTATION = r"""
name: facts
short_description: Facts in plain JSON files per host, read once per run
description:
  - The same files and settings as C(ansible.builtin.jsonfile) (one JSON file per host under
    C(fact_caching_connection), expiry after C(fact_caching_timeout) seconds), without ansible-core's
    per-read decode of the cached facts; a host's facts are read from disk once per run and then kept
    in memory as a plain dictionary.
  - Facts are stored without Ansible's data tags; strings read back are plain (never trusted as templates).
  - Files are named by the host name alone (C(jsonfile)'s are prefixed by a schema version, C(s1_)), so
    both can share a directory without reading each other's files.
author: sparkfleet developers
version_added: 2.0.0
options:
  _uri:
    required: true
    description:
      - Path in which the cache plugin saves the JSON files.
    env:
      - name: ANSIBLE_CACHE_PLUGIN_CONNECTION
    ini:
      - key: fact_caching_connection
        section: defaults
    type: path
  _prefix:
    description: A prefix for the files' names.
    env:
      - name: ANSIBLE_CACHE_PLUGIN_PREFIX
    ini:
      - key: fact_caching_prefix
        section: defaults
  _timeout:
    default: 86400
    description: Expiration timeout of the cached facts, in seconds.
    env:
      - name: ANSIBLE_CACHE_PLUGIN_TIMEOUT
    ini:
      - key: fact_caching_timeout
        section: defaults
    type: integer
"""


class CacheModule(BaseFileCacheModule):
    """One JSON file per host; in memory a plain dict (no interposer: see the module docstring)."""

    _persistent = False  # the loader then hands this plugin out unwrapped; the files below persist it

    def _load(self, filepath: str) -> object:
        return json.loads(Path(filepath).read_text())

    def _dump(self, value: object, filepath: str) -> None:
        Path(filepath).write_text(json.dumps(value, cls=AnsibleJSONEncoder, sort_keys=True))
