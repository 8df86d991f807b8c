"""capsvc: Cap'n Proto RPC (two-party, Level 1) for Python, on trio."""

from capsvc.errors import (
    CapsvcError as CapsvcError,
)
from capsvc.errors import (
    Disconnected as Disconnected,
)
from capsvc.errors import (
    ExceptionType as ExceptionType,
)
from capsvc.errors import (
    Failed as Failed,
)
from capsvc.errors import (
    FramingError as FramingError,
)
from capsvc.errors import (
    LocalProtocolError as LocalProtocolError,
)
from capsvc.errors import (
    Overloaded as Overloaded,
)
from capsvc.errors import (
    ProtocolError as ProtocolError,
)
from capsvc.errors import (
    RemoteProtocolError as RemoteProtocolError,
)
from capsvc.errors import (
    RpcError as RpcError,
)
from capsvc.errors import (
    SchemaError as SchemaError,
)
from capsvc.errors import (
    Unimplemented as Unimplemented,
)
