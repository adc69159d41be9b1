"""Hosts placed by Ray: `open_ray_provider` starts `codemode-host` actors on a Ray cluster.

Each actor runs one `codemode-host --listen` process on its node and reports its address; Ray
places the actors on nodes with free CPUs and restarts the ones that fail. The provider
connects to them through the remote provider (`codemode.remote`) and follows an actor that Ray
restarted to its new address (docs/scaling.md, "An existing cluster engine: Ray").

Needs the optional extra `codemode[ray]`. Importing this package without it raises one
`ImportError` whose text names the extra; `import codemode` never imports this package.
"""

from ._require import require_ray as _require_ray

_require_ray()

from ._provider import RayProvider as RayProvider  # noqa: E402
from ._provider import open_ray_provider as open_ray_provider  # noqa: E402

__all__ = ["RayProvider", "open_ray_provider"]
