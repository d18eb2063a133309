"""`build.py doctor [--layouts ...] [--work DIR]`: is this machine ready for Gemma-4 on Inferentia2, and
does every Neuron layout work on it, at the tiny shapes and at the real ones? What to run first on a new
inf2 machine, and the folder to attach to a bug report.

One concern per module:
- facts.py: what the machine has (wheels, apt packages, driver, devices, `neuron-ls`), each tool's
  failure kept as a fact, never raised;
- checks.py: one check per unit (a wheel, a package, the driver, the devices, the cores, the memory,
  a tool), each a finding with its fix;
- targets.py: what runs (the tiny layouts, a shipped variant of each real model with random weights of
  its real config) and what is skipped on this machine and why: pure planning;
- steps.py: a command in a process of its own, its whole log kept, its wall time and peak RSS;
- monitor.py: `neuron-monitor` sampled while a step runs, summarised per core and category;
- measure.py: TTFT and decode tok/s through the served OpenAI API, held against plan's roofline;
- report.py: the Markdown and JSON report and the folder they sit in;
- main.py: the command, tying them together.
"""
