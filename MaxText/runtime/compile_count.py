"""Counts XLA compilations and persistent-cache hits per jitted function, from JAX's monitoring events."""

import collections
import threading

import jax

# Recorded once per compile request that missed JAX's in-memory caches, whether or not the persistent cache answers.
REQUEST_EVENT = "/jax/core/compile/backend_compile_duration"
# Recorded inside such a request, before it ends, when the persistent compilation cache answered it.
HIT_EVENT = "/jax/compilation_cache/cache_hits"


class CompileCounter:
  """Within `with CompileCounter() as counter:`, every XLA compilation (`compiled`: {function name: count}, and
  `compile_seconds`) and every program the persistent cache supplied instead (`cache_hits`)."""

  def __init__(self):
    self.compiled = collections.Counter()
    self.cache_hits = collections.Counter()
    self.compile_seconds = 0.0
    self._hit = threading.local()  # a request's hit and its end are recorded on the thread that compiles

  def _on_event(self, event, **_):
    if event == HIT_EVENT:
      self._hit.pending = True

  def _on_duration(self, event, seconds, **kwargs):
    if event != REQUEST_EVENT:
      return
    name = str(kwargs.get("fun_name", "?"))
    if getattr(self._hit, "pending", False):
      self.cache_hits[name] += 1
    else:
      self.compiled[name] += 1
      self.compile_seconds += seconds
    self._hit.pending = False

  @property
  def compilations(self):
    return sum(self.compiled.values())

  def __enter__(self):
    jax.monitoring.register_event_listener(self._on_event)
    jax.monitoring.register_event_duration_secs_listener(self._on_duration)
    return self

  def __exit__(self, *exc):
    jax.monitoring.unregister_event_listener(self._on_event)
    jax.monitoring.unregister_event_duration_listener(self._on_duration)
    return False
