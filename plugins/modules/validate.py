# sparkfleet.cluster.validate is an action plugin (plugins/action/validate.py); this file holds its
# documentation only, as ansible-core documents its action-only plugins.
from __future__ import annotations

DOCUMENTATION = r"""
module: validate
short_description: Check a role's inputs, one message per rule that fails
description:
  - Inside a role (its C(tasks/validate.yml)), checks the role's variables, on the controller only - no
    connection, nothing changed. First every option of the role's C(meta/argument_specs.yml) (entry point
    C(main)) that has a value - its type, elements and choices (booleans must be YAML booleans) and the sample
    inventory's placeholder C(CHANGE-ME) -, then the C(rules) in order. A rule about a variable that already
    failed, or whose variables are all the role's defaults computed from other variables, is skipped, so every
    problem is named once, by the rule that owns it. Each message names the variable, its value and the fix
    (the option's description).
  - Fails with the list of problems, or, with C(collect) (or the variable C(sparkfleet_validate_collect)),
    records them in the node's host fact C(ansible_facts.sparkfleet_validation_problems) instead, with the
    warnings and the C(uniform) values, for the verdict (filter C(sparkfleet.cluster.validation_verdict)).
    Preflight layer 1 imports every role's C(tasks/validate.yml) this way, so each role's variables come from
    Ansible's own precedence; the variables a role refused are carried to the roles after it
    (C(sparkfleet_validation_refused)), whose rules about them are skipped.
options:
  rules:
    description:
      - The role's rules, each a mapping with C(var) (a name or a list) and one of - C(kind) (port,
        abs_path, data_dir, data_file, ifname, ip, host, cidr, str, int, number, mhz, hex40, digest,
        image, hf_repo, version) with optional C(min), C(max), C(pattern); C(min)/C(max) alone (a
        whole-number range); C(that) (conditions) with C(msg); C(problems) or C(warnings) (an expression
        giving a list of messages). Any rule may have C(when) and C(fix).
      - Paths are absolute and written plainly (no C(.), C(..), C(//) or trailing C(/); the plain form is
        the fix). C(data_dir) / C(data_file) are a role's own directory or file, which it makes and owns -
        never a system directory (C(/), C(/etc), C(/usr), C(/var), C(/home), ...) nor inside a system tree
        (C(/etc), C(/usr), C(/boot), C(/proc), C(/sys), C(/dev), C(/run), C(/var/lib/dpkg), ...), except
        inside the trees the rule's C(allow) names (e.g. C(/etc/sysctl.d) for a sysctl drop-in).
      - A rule about a variable whose value is written as a template of a variable already refused is
        skipped too (the variable the admin wrote is named, not the one computed from it).
      - Not templated up front - each rule is evaluated, and its message rendered, only when it applies.
    type: list
    elements: dict
    default: []
  uniform:
    description: Variables that must be equal on every node (preflight's verdict refuses a node that differs).
    type: list
    elements: str
    default: []
  collect:
    description: Record the problems in the node's facts instead of failing.
    type: bool
  entry_point:
    description: The argument spec entry point whose options are checked.
    type: str
    default: main
  reset:
    description: Start the recorded problems, warnings, values and refused variables of this node empty.
    type: bool
    default: false
attributes:
  check_mode:
    support: full
    description: It changes nothing in either mode.
  action:
    support: full
    description: Runs as an action plugin on the controller.
author: sparkfleet developers
"""

EXAMPLES = r"""
- name: Check engine_service's inputs
  sparkfleet.cluster.validate:
    uniform: [engine_service_port]
    rules:
      - {var: engine_service_port, kind: port}
      - var: [engine_service_host, engine_service_api_key_required]
        that: engine_service_api_key_required | bool or engine_service_host in ['127.0.0.1', '::1']
        msg: "engine_service_host={{ engine_service_host }} exposes the API beyond loopback without a key"
"""

RETURN = r"""
problems:
  description: One sentence per problem (variable, value, fix).
  type: list
  elements: str
  returned: inside a role
msg:
  description: The problems with a heading, or that the inputs are OK.
  type: raw
  returned: always
"""
