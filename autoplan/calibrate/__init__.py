"""``autoplan calibrate``: time GEMMs, attention and copies on the local GPU, fit a compute profile.

* ``plan``    -- which shapes to time (deterministic; ``--quick`` is a subset).  No torch.
* ``device``  -- is there a CUDA GPU, and which catalog GPU kind is it.
* ``measure`` -- times the plan with torch (CUDA events, warm-up, repeats) into
  ``costmodels.profile_fit.Measurements``.

The fit itself and the profile YAML live in ``costmodels/profile_fit.py`` (no torch).
"""
