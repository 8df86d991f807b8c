"""capsvc: Cap'n Proto RPC (two-party, Level 1) for Python, on trio.

The public names are re-exported here from the modules that define them, so that
``capsvc.X`` is the one spelling users need.
"""

# First: chooses between the compiled and the pure-Python build (capsvc/_build.py).
from capsvc._build import COMPILED as COMPILED
from capsvc.api import connect as connect
from capsvc.api import open_connection as open_connection
from capsvc.api import serve as serve
from capsvc.client import Client as Client
from capsvc.client import Promise as Promise
from capsvc.client import Request as Request
from capsvc.client import capability as capability
from capsvc.connection import Connection as Connection
from capsvc.errors import CapsvcError as CapsvcError
from capsvc.errors import Disconnected as Disconnected
from capsvc.errors import ExceptionType as ExceptionType
from capsvc.errors import Failed as Failed
from capsvc.errors import FramingError as FramingError
from capsvc.errors import LimitExceeded as LimitExceeded
from capsvc.errors import LocalProtocolError as LocalProtocolError
from capsvc.errors import Overloaded as Overloaded
from capsvc.errors import ProtocolError as ProtocolError
from capsvc.errors import RemoteProtocolError as RemoteProtocolError
from capsvc.errors import RpcError as RpcError
from capsvc.errors import SchemaError as SchemaError
from capsvc.errors import Unimplemented as Unimplemented
from capsvc.limits import FramingLimits as FramingLimits
from capsvc.limits import Limits as Limits
from capsvc.schema import load_schema as load_schema
from capsvc.server import Server as Server
from capsvc.transport.busypoll import DEFAULT_BUSY_POLL as DEFAULT_BUSY_POLL
