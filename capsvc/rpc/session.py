"""The protocol engine for one two-party connection (rpc.capnp, Level 1). Sans-I/O.

Theory of operation:
- Feed it whole messages with ``receive(segments)``; take what must be written with
  ``take_output()``. Every table change for a message happens synchronously inside
  ``receive``, in arrival order (rpc-protocol.md §13.1), and every outgoing message goes into
  one ordered outbox (capsvc.rpc.outbox, §13.2), so a driver that writes the outbox in one
  ``send_all`` keeps protocol order and coalesces writes for free.
- The five tables of §3 are components, one concept each: ``questions`` (our calls,
  capsvc.rpc.questions), ``answers`` (the peer's calls, capsvc.rpc.answers), ``exports``
  and ``imports`` (capability references, capsvc.rpc.exports and capsvc.rpc.imports) and
  ``embargoes`` (capsvc.rpc.embargoes). Question and answer lifecycles are the tables of
  capsvc.rpc.lifecycle. This module routes messages to them and sends calls.
- Local objects are reached through hooks (capsvc.rpc.hooks); remote ones through the hooks
  of capsvc.rpc.remote, which call back into ``send_call`` here.
- A violation by the peer raises RemoteProtocolError inside the handlers; ``receive`` turns
  it into an Abort message and closes the session (§10). After ``close`` every question fails
  with ``disconnected`` and every import is broken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import capnp

from capsvc.errors import (
    Disconnected,
    ExceptionType,
    Failed,
    LimitExceeded,
    Overloaded,
    RemoteProtocolError,
    RpcError,
    Unimplemented,
)
from capsvc.limits import Limits
from capsvc.rpc import copying, wire
from capsvc.rpc.answers import AnswerTable
from capsvc.rpc.embargoes import EmbargoTable
from capsvc.rpc.exports import ExportTable
from capsvc.rpc.hooks import (
    Backpressure,
    BrokenHook,
    CallObserver,
    CallResult,
    Canceled,
    Hook,
    OutgoingCall,
    null_hook,
)
from capsvc.rpc.imports import ImportTable
from capsvc.rpc.lifecycle import (
    Q_AWAITING_RETURN,
    Q_FINISHED_EARLY,
    Q_RETURNED,
    Q_TAKING,
    QI_RETURN,
    QI_RETURN_CANCELED,
    QI_RETURN_TAKE,
    QI_TAKE_SETTLED,
    QI_UNWANTED,
    QuestionInput,
)
from capsvc.rpc.outbox import Outbox
from capsvc.rpc.payload import (
    CodecPayload,
    Payload,
    ReceivedPayload,
    SharedPayload,
    WritablePayload,
    new_call_payload,
    new_return_payload,
)
from capsvc.rpc.questions import Question, QuestionTable
from capsvc.rpc.remote import PipelineHook, RemoteHook

Segments = Sequence[bytes | bytearray | memoryview]

#: rpc.c++ getMessageTarget's words for a promisedAnswer naming an answer that is gone.
GONE_ANSWER = "Pipeline call on a request that returned no capabilities or was already closed."


class RpcSession:
    """The engine of one connection. See the module docstring."""

    def __init__(
        self,
        bootstrap: Hook | None = None,
        *,
        limits: Limits | None = None,
        on_output: Callable[[], None] | None = None,
    ) -> None:
        self.bootstrap_hook = bootstrap
        self.limits = limits or Limits()
        self._reader_limits = (self.limits.traversal_limit_words, self.limits.nesting_limit)
        # The limits every message checks, as native ints (Limits is a Python dataclass:
        # reading its fields from compiled code is a generic attribute lookup each).
        self.max_answers: int = self.limits.max_answers
        self.max_questions: int = self.limits.max_questions
        self._max_calls_in_flight: int = self.limits.max_calls_in_flight
        self._max_call_bytes_in_flight: int = self.limits.max_call_bytes_in_flight
        self.outbox = Outbox(on_output)
        self.questions = QuestionTable(self)
        self.answers = AnswerTable(self)
        self.exports = ExportTable(self)
        self.imports = ImportTable(self)
        self.embargoes = EmbargoTable(self)
        #: The driver's view of its output bound, handed to the results of calls that go
        #: out here so that their callers can wait for room (set by the I/O driver).
        self.backpressure: Backpressure | None = None
        self.closed: RpcError | None = None
        self.abort_reason: str | None = None
        #: A hard limit our own side went over while the peer holds the excess (exports):
        #: the connection is aborted at the next safe point (``check_limits``).
        self._breach: LimitExceeded | None = None
        #: Called when reading may go on after a pause for the flow budget: calls in flight
        #: drop back within it, or a question of ours goes out (a call in flight may wait on
        #: its Return). Set by the driver, which says when it waits (``flow_waiting``).
        self.on_flow_released: Callable[[], None] | None = None
        self.flow_waiting = False
        #: Inside ``receive``: an abort for a breach waits until the message is handled.
        self._receiving = False
        #: Told of every call both ways (access log, tracing), if the driver sets one.
        self.observer: CallObserver | None = None
        #: Calls the peer made to us, and calls we sent it (for the driver's logs).
        self.calls_received = 0
        self.calls_sent = 0
        #: Set while the connection drains for a graceful shutdown (Connection.drain): new
        #: calls and bootstraps are answered with this error instead of being delivered.
        self.draining: RpcError | None = None
        #: Called when the peer's last call in flight has returned, while draining.
        self.on_idle: Callable[[], None] | None = None

    # ================================================================== limits
    @property
    def flow_blocked(self) -> bool:
        """True while the peer's calls in flight exceed the flow budget (Limits
        max_calls_in_flight / max_call_bytes_in_flight) and reading may pause.

        One call is always admitted (a call bigger than the byte budget still runs). And
        reading never pauses while we wait on the peer ourselves (a question awaiting its
        Return, an imported promise not yet resolved): a call in flight may be waiting on
        exactly that message, and pausing would deadlock (the trap C++'s setFlowLimit
        leaves for a budget set too low).
        """
        answers = self.answers
        if answers.in_flight == 0:
            return False
        if (
            answers.in_flight < self._max_calls_in_flight
            and answers.in_flight_bytes < self._max_call_bytes_in_flight
        ):
            return False
        return not (self.questions.awaiting_return() or self.imports.unresolved_promises())

    def note_breach(self, breach: LimitExceeded) -> None:
        """A hard limit was exceeded where aborting at once is not safe (inside building
        a message): abort at the next ``check_limits``."""
        if self._breach is None:
            self._breach = breach

    def check_limits(self) -> None:
        """Abort now if a hard limit was exceeded since the last check."""
        breach = self._breach
        if breach is not None and self.closed is None:
            self.abort(str(breach), ExceptionType.OVERLOADED)

    # ================================================================== output
    def take_output(self) -> list[bytes]:
        """Every framed message produced since the last call, in protocol order."""
        return self.outbox.take()

    @property
    def has_output(self) -> bool:
        return self.outbox.has_output

    @property
    def has_urgent_output(self) -> bool:
        """True if the outbox holds anything but Finish and Release messages."""
        return self.outbox.urgent

    @property
    def pending_bytes(self) -> int:
        """Bytes framed and not yet taken by the writer (for backpressure)."""
        return self.outbox.pending_bytes

    def tables_empty(self) -> bool:
        """True when all four tables and the embargo table are empty (tests check this)."""
        return not any(self.table_sizes().values())

    def table_sizes(self) -> dict[str, int]:
        return {
            "questions": len(self.questions.entries),
            "answers": len(self.answers.entries),
            "exports": len(self.exports.entries),
            "imports": len(self.imports.entries),
            "embargoes": len(self.embargoes.entries),
        }

    # ================================================================== commands
    def bootstrap(self) -> Hook:
        """Ask the peer for its bootstrap capability; usable (pipelined) at once."""
        result = CallResult()
        if self.closed is not None:
            result.set_error(self.closed)
        elif self._questions_full():
            result.set_error(self._questions_full_error())
        else:
            question = self.questions.new(result)
            message = wire.Message.new_message()
            message.init("bootstrap").questionId = question.id
            self.outbox.send(message.to_segments())
            result.link_question(question)
        hook = result.pipeline(())
        result.release()
        return hook

    def send_call(self, call: OutgoingCall, target: RemoteHook) -> None:
        """Send ``call`` to ``target``, a remote hook of this session (rpc-protocol.md §4).

        The Call's place in the outbox is reserved before its params are touched: a Release
        or Finish caused by dropping the params (they may hold our last reference to an
        import or a pipelined capability) follows the Call (rpc-protocol.md §13.10).
        """
        result = call.result
        if self.closed is not None or result.done:
            call.params.release()
            if not result.done:
                result.set_error(self.closed or Failed("call was canceled"))
            result.release()
            return
        if self._questions_full():
            call.params.release()
            result.set_error(self._questions_full_error())
            result.release()
            return
        place = self.outbox.reserve()
        upstream = target.question if isinstance(target, PipelineHook) else None
        question = self.questions.new(result, upstream)
        try:
            segments = self._build_call(call, question, target)
        except Exception as error:  # never into whoever made or forwarded the call
            self.outbox.give_up(place)
            self.exports.release_all(question.param_exports)
            self.questions.give_back(question)
            result.set_error(Failed(f"the call could not be sent: {error}"))
            result.release()
            return
        self.outbox.fill(place, segments)
        result.backpressure = self.backpressure
        result.link_question(question)
        self.calls_sent += 1
        if self.observer is not None:
            result.add_done_callback(self.observer.sent(call.interface_id, call.method_id))
        result.release()  # the question keeps an uncounted link (see OutgoingCall)
        if self.flow_waiting and self.on_flow_released is not None:
            self.on_flow_released()  # we now wait on the peer: reading must go on
        if not self._receiving:  # (a call made while a message is handled: receive checks)
            self.check_limits()

    def _questions_full(self) -> bool:
        return len(self.questions.entries) >= self.max_questions

    def _questions_full_error(self) -> Overloaded:
        # A local limit: our own calls, so the call fails and the connection goes on.
        return Overloaded(
            f"{len(self.questions.entries)} calls to the peer are outstanding, the limit "
            f"(Limits.max_questions = {self.limits.max_questions})"
        )

    def _build_call(
        self, call: OutgoingCall, question: Question, target: RemoteHook
    ) -> list[bytes | bytearray]:
        params = call.params
        if not (
            isinstance(params, WritablePayload) and params.content_path == wire.CALL_CONTENT_PATH
        ):
            params = copying.copy_to_call(params, new_call_payload())
            call.params.release()
        import_id = target.imported_target()
        if isinstance(params, CodecPayload) and import_id >= 0:
            params.write_call_header(question.id, call.interface_id, call.method_id, import_id)
        else:
            body = params.header()
            body.questionId = question.id
            body.interfaceId = call.interface_id
            body.methodId = call.method_id
            target.write_target(body.target)
        describe = self.exports.describe
        exports = question.param_exports
        segments = params.write(lambda desc, _index, hook: describe(desc, hook, exports))
        params.release()
        wire.check_sendable(segments, self.limits.max_message_words, "the Call")
        return segments

    # ================================================================== receive
    def receive(self, segments: Segments) -> None:
        """Handle one whole incoming message (its segments, as the framing produced them)."""
        if self.closed is not None:
            return
        self._receiving = True
        try:
            self._dispatch(segments)
        except LimitExceeded as error:
            self.abort(str(error), ExceptionType.OVERLOADED)
        except RemoteProtocolError as error:
            self.abort(str(error))
        except capnp.KjException as error:
            self.abort(f"malformed message: {_kj_reason(error)}")
        finally:
            self._receiving = False
        self.check_limits()

    def _dispatch(self, segments: Segments) -> None:
        tag = wire.message_tag(segments)
        # The common messages, read from the raw words alone (no pycapnp reader of the
        # whole message): a Call to an import and a Return with results, with their cap
        # tables, and every Finish and Release.
        if tag == wire.CALL:
            call = wire.read_call_header(segments)
            if call is not None and (call.target_is_import or call.promised is not None):
                entries = wire.read_cap_table(segments, call.content_word) if call.has_caps else []
                if entries is not None:
                    self._on_fast_call(call, None, segments, entries)
                    return
        elif tag == wire.RETURN:
            header = wire.read_return_header(segments)
            if header is not None and header.which == 0:
                entries = (
                    wire.read_cap_table(segments, header.content_word) if header.has_caps else []
                )
                if entries is not None:
                    self._on_results_return(header, None, segments, entries)
                    return
        elif tag == wire.FINISH:
            finish = wire.read_finish(segments)
            if finish is not None:
                self.answers.on_finish(*finish)
                return
        elif tag == wire.RELEASE:
            release = wire.read_release(segments)
            if release is not None:
                self.exports.release(*release)
                return
        message = wire.read_message(
            segments,
            traversal_limit_words=self.limits.traversal_limit_words,
            nesting_limit=self.limits.nesting_limit,
        )
        handler = self._HANDLERS.get(tag) if tag is not None else None
        if handler is None:
            self.echo_unimplemented(message)
            return
        handler(self, message, segments)

    def echo_unimplemented(self, message: Any) -> None:
        """rpc-protocol.md §11: send what we do not understand back, verbatim."""
        reply = wire.Message.new_message()
        reply.unimplemented = message
        self.outbox.send(reply.to_segments())

    def message_target(self, target: Any) -> Hook:
        """A new reference to the hook a MessageTarget names (rpc-protocol.md §13.11: an
        unknown export is a violation, a gone answer a broken capability)."""
        if target.which() == "importedCap":
            return self.exports.target(target.importedCap)
        promised = target.promisedAnswer
        path = wire.transform_path(promised.transform)
        return self.answers.pipelined(promised.questionId, path, GONE_ANSWER)

    # -------------------------------------------------------------- bootstrap
    def _on_bootstrap(self, message: Any, segments: Segments) -> None:
        body = message.bootstrap
        answer_id = body.questionId
        if answer_id in self.answers.entries:
            raise RemoteProtocolError(f"bootstrap reuses question ID {answer_id} still in use")
        if body._has("deprecatedObjectId"):
            raise RemoteProtocolError("bootstrap with deprecatedObjectId is not supported")
        result = CallResult()
        self.answers.start(answer_id, result, redirected=False, size=0)
        if self.draining is not None:
            result.set_error(self.draining)
            return
        if self.bootstrap_hook is None:
            result.set_error(Failed("this vat has no bootstrap capability"))
            return
        payload = new_return_payload()
        payload.set_cap((), self.bootstrap_hook.add_ref())
        result.set_result(payload)

    # -------------------------------------------------------------- call
    def _on_call(self, message: Any, segments: Segments) -> None:
        header = wire.read_call_header(segments)
        if header is None:
            self._on_call_slow(message, segments)
            return
        self._on_fast_call(header, message, segments)

    def _on_fast_call(
        self,
        header: wire.CallHeader,
        message: Any,
        segments: Segments,
        entries: list[wire.CapEntry] | None = None,
    ) -> None:
        """A Call whose header came from the raw words. ``message``, the pycapnp reader, is
        needed only for a promisedAnswer target, or a capTable not read from the raw words
        (``entries``); it is None otherwise."""
        answer_id = header.question_id
        if answer_id in self.answers.entries:
            raise RemoteProtocolError(f"call reuses question ID {answer_id} still in use")
        if header.send_to == 2:
            raise RemoteProtocolError("sendResultsTo.thirdParty is Level 3; not supported")
        if header.target_is_import:
            export = self.exports.entries.get(header.imported_cap)
            target = (
                export.hook.add_ref()
                if export is not None
                else self.exports.target(header.imported_cap)  # raises: not exported
            )
        elif header.promised is not None:
            question, path = header.promised
            target = self.answers.pipelined(question, path, GONE_ANSWER)
        else:
            target = self.message_target(message.call.target)
        caps: list[Hook | None] = []
        if entries is not None:
            caps, _ = self._receive_cap_entries(entries)
        elif header.has_caps:
            caps, _ = self._receive_cap_table(message.call.params.capTable)
        params = ReceivedPayload(
            segments,
            message,
            wire.CALL_CONTENT_PATH,
            caps,
            content_word=header.content_word,
            limits=self._reader_limits,
        )
        self._deliver_call(target, answer_id, header.send_to == 1, header, params)

    def _on_call_slow(self, message: Any, segments: Segments) -> None:
        """The same as ``_on_call``, reading every field through pycapnp."""
        body = message.call
        answer_id = body.questionId
        if answer_id in self.answers.entries:
            raise RemoteProtocolError(f"call reuses question ID {answer_id} still in use")
        send_to = body.sendResultsTo.which()
        if send_to == "thirdParty":
            raise RemoteProtocolError("sendResultsTo.thirdParty is Level 3; not supported")
        target = self.message_target(body.target)
        params_reader = body.params
        caps, _ = self._receive_cap_table(params_reader.capTable)
        params = ReceivedPayload(
            segments,
            message,
            wire.CALL_CONTENT_PATH,
            caps,
            params_reader,
            limits=self._reader_limits,
        )
        header = wire.CallHeader()
        header.interface_id = body.interfaceId
        header.method_id = body.methodId
        self._deliver_call(target, answer_id, send_to == "yourself", header, params)

    def _deliver_call(
        self,
        target: Hook,
        answer_id: int,
        redirected: bool,
        header: wire.CallHeader,
        params: ReceivedPayload,
    ) -> None:
        result = CallResult()
        size = 0
        for segment in params.segments:
            size += len(segment)
        self.answers.start(answer_id, result, redirected=redirected, size=size)
        self.calls_received += 1
        call = OutgoingCall(header.interface_id, header.method_id, params, result.add_ref())
        call.received = True
        if self.observer is not None:
            observed = self.observer.received(header.interface_id, header.method_id, params)
            result.add_done_callback(observed)
            call.observed = observed
        if self.draining is not None:
            # A graceful shutdown refuses what arrives after it began, as an error the
            # caller can act on (disconnected: "try again on a new connection", rpc.capnp
            # Exception.Type), while the calls already running finish.
            target.release()
            target = BrokenHook(self.draining)
        call.from_peer = True  # only while it is handed over (see OutgoingCall)
        target.call(call)
        call.from_peer = False
        target.release()

    def _receive_cap_table(self, cap_table: Any) -> tuple[list[Hook | None], tuple[int, ...]]:
        """The hooks of a received cap table, and the indices the peer reflected to us."""
        receive = self.imports.receive
        return _hooks_and_reflected([receive(desc) for desc in cap_table])

    def _receive_cap_entries(
        self, entries: list[wire.CapEntry]
    ) -> tuple[list[Hook | None], tuple[int, ...]]:
        """The same for a cap table read from the raw words (wire.read_cap_table)."""
        if not entries:  # the common case: a cap-free payload
            return [], ()
        receive = self.imports.receive_entry
        return _hooks_and_reflected([receive(kind, num, path) for kind, num, path in entries])

    # -------------------------------------------------------------- finish, release, resolve
    def _on_finish(self, message: Any, segments: Segments) -> None:
        body = message.finish
        self.answers.on_finish(body.questionId, body.releaseResultCaps)

    def _on_release(self, message: Any, segments: Segments) -> None:
        body = message.release
        self.exports.release(body.id, body.referenceCount)

    def _on_resolve(self, message: Any, segments: Segments) -> None:
        self.imports.on_resolve(message.resolve)

    def _on_disembargo(self, message: Any, segments: Segments) -> None:
        self.embargoes.on_disembargo(message)

    # -------------------------------------------------------------- return
    def _on_return(self, message: Any, segments: Segments) -> None:
        header = wire.read_return_header(segments)
        if header is not None and header.which == 0:
            self._on_results_return(header, message, segments)
        else:
            self._on_return_slow(message, segments)

    def _on_results_return(
        self,
        header: wire.ReturnHeader,
        message: Any,
        segments: Segments,
        entries: list[wire.CapEntry] | None = None,
    ) -> None:
        """A Return carrying results, read from the raw words (the common case); its cap
        table too when ``entries`` has it, else through ``message``."""
        question = self.questions.awaiting(header.answer_id)
        self._returned(question, header.release_param_caps, header.no_finish_needed)
        if question.state is Q_FINISHED_EARLY:
            # We finished with releaseResultCaps=true: the callee releases them itself.
            self._settle(question, QI_RETURN, None, None)
            return
        payload = self._results_payload(message, segments, header, entries)
        self._settle(question, QI_RETURN, payload, None)

    def _results_payload(
        self,
        message: Any,
        segments: Segments,
        header: wire.ReturnHeader | None,
        entries: list[wire.CapEntry] | None = None,
    ) -> ReceivedPayload:
        results = None
        if entries is not None:
            caps, reflected = self._receive_cap_entries(entries)
        else:
            if header is None or header.has_caps:
                results = getattr(message, "return").results
            caps, reflected = self._receive_cap_table(results.capTable) if results else ([], ())
        return ReceivedPayload(
            segments,
            message,
            wire.RETURN_CONTENT_PATH,
            caps,
            results,
            content_word=header.content_word if header is not None else -1,
            limits=self._reader_limits,
            reflected=frozenset(reflected),
        )

    def _on_return_slow(self, message: Any, segments: Segments) -> None:
        body = getattr(message, "return")
        question = self.questions.awaiting(body.answerId)
        self._returned(question, body.releaseParamCaps, body.noFinishNeeded)
        early = question.state is Q_FINISHED_EARLY
        which = body.which()
        if which == "results":
            payload = None if early else self._results_payload(message, segments, None)
            self._settle(question, QI_RETURN, payload, None)
        elif which == "exception":
            self._settle(question, QI_RETURN, None, wire.read_exception(body.exception))
        elif which == "canceled":
            self._settle(question, QI_RETURN_CANCELED, None, None)
        elif which == "takeFromOtherQuestion":
            self._take_from_other_question(question, body.takeFromOtherQuestion)
        elif which == "resultsSentElsewhere":
            # We never send sendResultsTo.yourself, so no Return may say this (§4).
            raise RemoteProtocolError("resultsSentElsewhere for a call not sent with 'yourself'")
        else:
            raise RemoteProtocolError(f"return variant {which!r} is not supported (Level 3)")

    def _returned(self, question: Question, release_param_caps: bool, no_finish: bool) -> None:
        """What every Return does first: a second one is a violation; releaseParamCaps
        (C++ sends false; honour true) and noFinishNeeded are taken in."""
        if question.state not in (Q_AWAITING_RETURN, Q_FINISHED_EARLY):
            raise RemoteProtocolError(
                f"return for question {question.id}, which is not awaiting one"
            )
        if release_param_caps and question.param_exports:
            exports, question.param_exports = question.param_exports, []
            self.exports.release_all(exports)
        question.no_finish_needed = no_finish

    def _take_from_other_question(self, question: Question, other_id: int) -> None:
        """rpc-protocol.md §6.2: the results are those of our answer ``other_id``."""
        answer = self.answers.take(other_id)  # each answer is taken once
        if question.state is Q_FINISHED_EARLY:
            # Nobody wants the results any more: stop the work of the other call (its
            # Return, resultsSentElsewhere, still goes out).
            self.questions.advance(question, QI_RETURN_TAKE)
            if not answer.result.pipelined:
                answer.result.cancel()
            return
        self.questions.advance(question, QI_RETURN_TAKE)
        source = answer.result.add_ref()

        def forward(done: CallResult) -> None:
            if question.state is Q_TAKING:
                if done.error is not None:
                    self._settle(question, QI_TAKE_SETTLED, None, done.error)
                else:
                    self._settle(question, QI_TAKE_SETTLED, SharedPayload(done.payload), None)
            source.release()

        source.add_done_callback(forward)

    def _settle(
        self,
        question: Question,
        event: QuestionInput,
        payload: Payload | None,
        error: RpcError | None,
    ) -> None:
        """Move the question by ``event``; settle its pipelines (with embargoes), then its
        result.

        While settling pipelines, the question holds itself: the Finish that dropping the
        last pipeline may cause must follow every Disembargo the pipelines start (§13.4).
        """
        guard = bool(question.pipelines)
        if guard:
            question.add_holder()
        if self.questions.advance(question, event) is not Q_RETURNED:
            # Finished early (or disconnected): nobody waits for these results.
            result, question.result = question.result, None
            if result is not None:
                result.set_error(error or Canceled("canceled"))
            if payload is not None:
                payload.release()
            return
        for path, hook in list(question.pipelines.items()):
            if error is not None:
                target: Hook = BrokenHook(error)
                reflected = False
            else:
                assert payload is not None
                found = payload.locate_cap(path)
                target = payload.cap_at(path) or null_hook()
                reflected = isinstance(payload, ReceivedPayload) and found in payload.reflected
            hook.settle(target, reflected=reflected)
        result, question.result = question.result, None
        if result is not None:
            if error is not None:
                result.set_error(error)
            else:
                assert payload is not None
                result.set_result(payload)
                payload = None
        if payload is not None:
            payload.release()
        if guard:
            question.drop_holder()
        elif not question.holders and question.state is Q_RETURNED:
            self.questions.advance(question, QI_UNWANTED)  # (settling the result may have)

    # -------------------------------------------------------------- abort, unimplemented
    def _on_abort(self, message: Any, segments: Segments) -> None:
        error = wire.read_exception(message.abort)
        self.close(Disconnected(f"peer aborted the connection: {error.reason}"))

    def _on_unimplemented(self, message: Any, segments: Segments) -> None:
        """rpc-protocol.md §11: the peer echoed one of our messages."""
        inner = message.unimplemented
        which = inner.which()
        if which == "resolve":
            cap = inner.resolve
            if cap.which() == "cap" and cap.cap.which() in ("senderHosted", "senderPromise"):
                self.exports.release(getattr(cap.cap, cap.cap.which()), 1)
            return
        if which in ("bootstrap", "call"):
            question_id = (
                inner.bootstrap.questionId if which == "bootstrap" else inner.call.questionId
            )
            question = self.questions.entries.get(question_id)
            if question is not None and question.state is Q_AWAITING_RETURN:
                # The peer never saw the call: nothing to finish either.
                question.no_finish_needed = True
                failure = Unimplemented(f"peer does not implement {which}")
                self._settle(question, QI_RETURN, None, failure)
            return
        raise RemoteProtocolError(f"peer did not understand our {which!r} message")

    # ================================================================== shutdown
    def abort(self, reason: str, kind: ExceptionType = ExceptionType.FAILED) -> None:
        """A protocol violation (or a hard limit, ``kind`` overloaded): send Abort, then
        close (rpc-protocol.md §10)."""
        if self.closed is not None:
            return
        self.abort_reason = reason
        message = wire.Message.new_message()
        body = message.init("abort")
        body.reason = reason
        body.type = int(kind)
        self.outbox.send(message.to_segments())
        self.close(Disconnected(f"connection aborted: {reason}"))

    def close(self, error: RpcError) -> None:
        """The connection is gone: fail and drop everything (rpc-protocol.md §10)."""
        if self.closed is not None:
            return
        self.closed = error
        for question in self.questions.disconnect_all():
            result, question.result = question.result, None
            for hook in list(question.pipelines.values()):
                hook.settle(BrokenHook(error), reflected=False)
            if result is not None:
                result.set_error(error)
        self.imports.close(error)
        self.embargoes.close()
        self.exports.close()
        self.answers.close()
        # The bootstrap reference the driver gave us is ours to let go (else no bootstrap
        # object a connection served is ever disposed).
        bootstrap, self.bootstrap_hook = self.bootstrap_hook, None
        if bootstrap is not None:
            bootstrap.release()

    #: Filled in below the class (its methods do not exist before). A ClassVar: mypyc
    #: lets code outside the class assign only class attributes declared ClassVar.
    _HANDLERS: ClassVar[dict[int, Callable[[RpcSession, Any, Segments], None]]] = {}


RpcSession._HANDLERS = {
    wire.UNIMPLEMENTED: RpcSession._on_unimplemented,
    wire.ABORT: RpcSession._on_abort,
    wire.CALL: RpcSession._on_call,
    wire.RETURN: RpcSession._on_return,
    wire.FINISH: RpcSession._on_finish,
    wire.RESOLVE: RpcSession._on_resolve,
    wire.RELEASE: RpcSession._on_release,
    wire.BOOTSTRAP: RpcSession._on_bootstrap,
    wire.DISEMBARGO: RpcSession._on_disembargo,
}


def _kj_reason(error: Exception) -> str:
    text = str(error)
    return text.split("\nstack:")[0]


def _hooks_and_reflected(
    received: list[tuple[Hook | None, bool]],
) -> tuple[list[Hook | None], tuple[int, ...]]:
    """A cap table's hooks, in order, and the indices of those the peer reflected to us."""
    caps = [hook for hook, _ in received]
    return caps, tuple(index for index, (_, reflected) in enumerate(received) if reflected)
