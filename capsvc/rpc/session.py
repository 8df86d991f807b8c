"""The protocol engine for one two-party connection (rpc.capnp, Level 1). Sans-I/O.

Theory of operation:
- Feed it whole messages with ``receive(segments)``; take what must be written with
  ``take_output()``. Every table change for a message happens synchronously inside
  ``receive``, in arrival order (rpc-protocol.md §13.1), and every outgoing message is framed
  into one ordered outbox (§13.2), so a driver that writes the outbox in one ``send_all``
  keeps protocol order and coalesces writes for free.
- The four tables of §3 live here: ``questions`` (our calls), ``answers`` (the peer's calls),
  ``exports`` (our capabilities the peer holds) and ``imports`` (the peer's capabilities we
  hold), plus the private embargo table of §9. Their entries are in capsvc.rpc.tables; the
  handling of capability references (descriptors, releases, resolves, embargoes) is the
  CapabilityTables half, in capsvc.rpc.captable.
- Local objects are reached through hooks (capsvc.rpc.hooks); remote ones through the hooks
  of capsvc.rpc.remote, which call back into ``send_call`` here.
- A violation by the peer raises RemoteProtocolError inside the handlers; ``receive`` turns
  it into an Abort message and closes the session (§10). After ``close`` every question fails
  with ``disconnected`` and every import is broken.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import capnp

from capsvc.errors import (
    Disconnected,
    ExceptionType,
    Failed,
    RemoteProtocolError,
    RpcError,
    Unimplemented,
)
from capsvc.framing import FramingLimits, encode_message
from capsvc.rpc import copying, wire
from capsvc.rpc.captable import CapabilityTables
from capsvc.rpc.hooks import (
    BrokenHook,
    CallResult,
    Hook,
    OutgoingCall,
    null_hook,
)
from capsvc.rpc.ids import IdAllocator
from capsvc.rpc.payload import (
    BuiltPayload,
    Payload,
    ReceivedPayload,
    new_call_payload,
    new_return_payload,
)
from capsvc.rpc.remote import ImportPromiseHook, RemoteHook, RemotePromise
from capsvc.rpc.tables import (
    Answer,
    Canceled,
    Export,
    Import,
    Question,
    SharedPayload,
    transform_path,
)

Segments = Sequence[bytes | bytearray | memoryview]


class RpcSession(CapabilityTables):
    """The engine of one connection. See the module docstring."""

    def __init__(
        self,
        bootstrap: Hook | None = None,
        *,
        limits: FramingLimits | None = None,
        on_output: Callable[[], None] | None = None,
    ) -> None:
        self.bootstrap_hook = bootstrap
        self.limits = limits or FramingLimits()
        self._reader_limits = (self.limits.traversal_limit_words, self.limits.nesting_limit)
        self.on_output = on_output
        self.questions: dict[int, Question] = {}
        self.answers: dict[int, Answer] = {}
        self.exports: dict[int, Export] = {}
        self.imports: dict[int, Import] = {}
        self.embargoes: dict[int, RemotePromise] = {}
        self._question_ids = IdAllocator()
        self._export_ids = IdAllocator()
        self._embargo_ids = IdAllocator()
        self._export_by_hook: dict[Hook, int] = {}
        self._outbox: list[bytes] = []
        self._pending_bytes = 0
        self._urgent = False
        #: The I/O driver running this session, if any (the trio Connection sets itself
        #: here so that callers can find it for backpressure). The engine never uses it.
        self.driver: object | None = None
        self.closed: RpcError | None = None
        self.abort_reason: str | None = None

    # ================================================================== output
    def take_output(self) -> list[bytes]:
        """Every framed message produced since the last call, in protocol order."""
        out, self._outbox = self._outbox, []
        self._pending_bytes = 0
        self._urgent = False
        return out

    @property
    def has_output(self) -> bool:
        return bool(self._outbox)

    @property
    def pending_bytes(self) -> int:
        """Bytes framed and not yet taken by the writer (for backpressure)."""
        return self._pending_bytes

    def _send(self, segments: Segments, urgent: bool = True) -> None:
        """Queue one message. ``urgent=False`` marks housekeeping (Finish, Release) that the
        peer does not answer: a driver may hold it back to travel with the next message."""
        frame = encode_message(segments)
        self._outbox.append(frame)
        self._pending_bytes += len(frame)
        became_urgent = urgent and not self._urgent
        if urgent:
            self._urgent = True
        if (len(self._outbox) == 1 or became_urgent) and self.on_output is not None:
            self.on_output()

    def _send_message(self, message: Any, urgent: bool = True) -> None:
        self._send(message.to_segments(), urgent)

    @property
    def has_urgent_output(self) -> bool:
        """True if the outbox holds anything but Finish and Release messages."""
        return self._urgent

    def tables_empty(self) -> bool:
        """True when all four tables and the embargo table are empty (tests check this)."""
        return not (
            self.questions or self.answers or self.exports or self.imports or self.embargoes
        )

    def table_sizes(self) -> dict[str, int]:
        return {
            "questions": len(self.questions),
            "answers": len(self.answers),
            "exports": len(self.exports),
            "imports": len(self.imports),
            "embargoes": len(self.embargoes),
        }

    # ================================================================== commands
    def bootstrap(self) -> Hook:
        """Ask the peer for its bootstrap capability; usable (pipelined) at once."""
        result = CallResult()
        if self.closed is not None:
            result.set_error(self.closed)
            hook = result.pipeline(())
            result.release()
            return hook
        question = self._new_question(result)
        message = wire.Message.new_message()
        message.init("bootstrap").questionId = question.id
        self._send_message(message)
        result.link_question(question)
        hook = result.pipeline(())
        result.release()
        return hook

    def send_call(self, call: OutgoingCall, target: RemoteHook) -> None:
        """Send ``call`` to ``target``, a remote hook of this session (rpc-protocol.md §4)."""
        if self.closed is not None:
            call.params.release()
            call.result.set_error(self.closed)
            call.result.release()
            return
        params = call.params
        if not (isinstance(params, BuiltPayload) and params.content_path == wire.CALL_CONTENT_PATH):
            params = copying.copy_to_call(params, new_call_payload())
            call.params.release()
        question = self._new_question(call.result)
        body = params.body if params.body is not None else params.message.call
        body.questionId = question.id
        body.interfaceId = call.interface_id
        body.methodId = call.method_id
        target.write_target(body.target)
        segments = params.write(
            lambda desc, hook: self._describe(desc, hook, question.param_exports)
        )
        params.release()
        self._send(segments)
        call.result.origin = self
        call.result.link_question(question)
        call.result.release()  # the question keeps an uncounted link (see OutgoingCall)

    # ================================================================== receive
    def receive(self, segments: Segments) -> None:
        """Handle one whole incoming message (its segments, as the framing produced them)."""
        if self.closed is not None:
            return
        try:
            self._dispatch(segments)
        except RemoteProtocolError as error:
            self.abort(str(error))
        except capnp.KjException as error:
            self.abort(f"malformed message: {_kj_reason(error)}")

    def _dispatch(self, segments: Segments) -> None:
        tag = wire.message_tag(segments)
        # The common messages, read from the raw words alone (no pycapnp reader of the
        # whole message): a Call to an import and a Return with results, both cap-free.
        if tag == wire.CALL:
            call = wire.read_call_header(segments)
            if call is not None and call.target_is_import and not call.has_caps:
                self._on_fast_call(call, None, segments)
                return
        elif tag == wire.RETURN:
            header = wire.read_return_header(segments)
            if header is not None and header.which == 0 and not header.has_caps:
                self._on_results_return(header, None, segments)
                return
        message = wire.read_message(
            segments,
            traversal_limit_words=self.limits.traversal_limit_words,
            nesting_limit=self.limits.nesting_limit,
        )
        handler = self._HANDLERS.get(tag) if tag is not None else None
        if handler is None:
            self._echo_unimplemented(message)
            return
        handler(self, message, segments)

    def _echo_unimplemented(self, message: Any) -> None:
        """rpc-protocol.md §11: send what we do not understand back, verbatim."""
        reply = wire.Message.new_message()
        reply.unimplemented = message
        self._send_message(reply)

    # -------------------------------------------------------------- bootstrap
    def _on_bootstrap(self, message: Any, segments: Segments) -> None:
        body = message.bootstrap
        answer_id = body.questionId
        if answer_id in self.answers:
            raise RemoteProtocolError(f"bootstrap reuses question ID {answer_id} still in use")
        if body._has("deprecatedObjectId"):
            raise RemoteProtocolError("bootstrap with deprecatedObjectId is not supported")
        result = CallResult()
        self._start_answer(answer_id, result, redirected=False)
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

    def _on_fast_call(self, header: wire.CallHeader, message: Any, segments: Segments) -> None:
        """A Call whose header came from the raw words. ``message``, the pycapnp reader, is
        needed only for a promisedAnswer target or a capTable; it is None otherwise."""
        answer_id = header.question_id
        if answer_id in self.answers:
            raise RemoteProtocolError(f"call reuses question ID {answer_id} still in use")
        if header.send_to == 2:
            raise RemoteProtocolError("sendResultsTo.thirdParty is Level 3; not supported")
        if header.target_is_import:
            export = self.exports.get(header.imported_cap)
            if export is None:
                raise RemoteProtocolError(
                    f"call to export ID {header.imported_cap}, which is not exported"
                )
            target = export.hook.add_ref()
        else:
            target = self._message_target(message.call.target)
        caps = (
            [self._import_descriptor(d) for d in message.call.params.capTable]
            if header.has_caps
            else []
        )
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
        if answer_id in self.answers:
            raise RemoteProtocolError(f"call reuses question ID {answer_id} still in use")
        send_to = body.sendResultsTo.which()
        if send_to == "thirdParty":
            raise RemoteProtocolError("sendResultsTo.thirdParty is Level 3; not supported")
        target = self._message_target(body.target)
        params_reader = body.params
        caps = [self._import_descriptor(d) for d in params_reader.capTable]
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
        self._start_answer(answer_id, result, redirected=redirected)
        target.call(OutgoingCall(header.interface_id, header.method_id, params, result.add_ref()))
        target.release()

    def _message_target(self, target: Any) -> Hook:
        """A new reference to the hook a MessageTarget names (unknown IDs are violations)."""
        if target.which() == "importedCap":
            export = self.exports.get(target.importedCap)
            if export is None:
                raise RemoteProtocolError(
                    f"call to export ID {target.importedCap}, which is not exported"
                )
            return export.hook.add_ref()
        promised = target.promisedAnswer
        answer = self.answers.get(promised.questionId)
        if answer is None:
            raise RemoteProtocolError(
                f"promisedAnswer names question {promised.questionId}, which is not current"
            )
        return answer.result.pipeline(transform_path(promised.transform))

    def _start_answer(self, answer_id: int, result: CallResult, *, redirected: bool) -> None:
        answer = Answer(answer_id, result, redirected)
        self.answers[answer_id] = answer
        result.add_done_callback(lambda _: self._send_return(answer))

    # -------------------------------------------------------------- return (sending)
    def _send_return(self, answer: Answer) -> None:
        if self.closed is not None or self.answers.get(answer.id) is not answer:
            return
        result = answer.result
        answer.return_sent = True
        if answer.finish_received:
            self._send_simple_return(answer.id, "canceled")
            self._forget_answer(answer)
            return
        if answer.redirected:
            # rpc-protocol.md §6.2: a call sent with `yourself` is always answered with
            # resultsSentElsewhere, even when it failed (C++ aborts otherwise); the caller
            # learns the outcome through its takeFromOtherQuestion.
            self._send_simple_return(answer.id, "resultsSentElsewhere")
            return
        error = result.error
        if error is not None:
            self._send_exception_return(answer.id, error)
            return
        payload = result.payload
        if not (
            isinstance(payload, BuiltPayload) and payload.content_path == wire.RETURN_CONTENT_PATH
        ):
            payload = copying.copy_to_return(payload, new_return_payload())
            owned = True
        else:
            owned = False
        body = payload.body if payload.body is not None else getattr(payload.message, "return")
        body.answerId = answer.id
        body.releaseParamCaps = False
        no_caps = not any(hook is not None for hook in payload.caps)
        if no_caps:
            # rpc-protocol.md §4 callee step 3: cap-free results need no Finish (C++ does this).
            body.noFinishNeeded = True
        segments = payload.write(
            lambda desc, hook: self._describe(desc, hook, answer.result_exports)
        )
        if owned:
            payload.release()
        self._send(segments)
        if no_caps:
            self._forget_answer(answer)

    def _send_simple_return(self, answer_id: int, which: str) -> None:
        message = wire.Message.new_message()
        body = message.init("return")
        body.answerId = answer_id
        body.releaseParamCaps = False
        setattr(body, which, None)
        self._send_message(message)

    def _send_exception_return(self, answer_id: int, error: RpcError) -> None:
        message = wire.Message.new_message()
        body = message.init("return")
        body.answerId = answer_id
        body.releaseParamCaps = False
        wire.write_exception(body.init("exception"), error)
        self._send_message(message)

    def _forget_answer(self, answer: Answer) -> None:
        if self.answers.get(answer.id) is answer:
            del self.answers[answer.id]
        answer.result.release()

    # -------------------------------------------------------------- finish
    def _on_finish(self, message: Any, segments: Segments) -> None:
        body = message.finish
        answer = self.answers.get(body.questionId)
        if answer is None:
            return  # it may have crossed our noFinishNeeded return (rpc-protocol.md §13.8)
        if answer.finish_received:
            raise RemoteProtocolError(f"second finish for question {body.questionId}")
        answer.finish_received = True
        if body.releaseResultCaps:
            exports, answer.result_exports = answer.result_exports, []
            for export_id in exports:
                self._release_export(export_id, 1)
        if answer.return_sent:
            self._forget_answer(answer)
        elif answer.result.refs <= 1:
            # Nothing but this answer wants the results: cancel the work (§4 callee step 4).
            # If something else still does (a pipelined capability of this answer that the
            # peer passed back to us as receiverAnswer), the call runs on; its Return will
            # say 'canceled', since the caller finished.
            answer.result.cancel()

    # -------------------------------------------------------------- return (receiving)
    def _on_return(self, message: Any, segments: Segments) -> None:
        header = wire.read_return_header(segments)
        if header is not None and header.which == 0:
            self._on_results_return(header, message, segments)
        else:
            self._on_return_slow(message, segments)

    def _on_results_return(
        self, header: wire.ReturnHeader, message: Any, segments: Segments
    ) -> None:
        """A Return carrying results, read from the raw words (the common case)."""
        question = self.questions.get(header.answer_id)
        if question is None or question.returned:
            raise RemoteProtocolError(
                f"return for question {header.answer_id}, which is not awaiting one"
            )
        question.returned = True
        if header.release_param_caps and question.param_exports:
            exports, question.param_exports = question.param_exports, []
            for export_id in exports:
                self._release_export(export_id, 1)
        if question.finish_sent:
            # We finished with releaseResultCaps=true: the callee releases them itself.
            self._complete_question(question, None, Canceled("canceled"))
        else:
            results = getattr(message, "return").results if header.has_caps else None
            caps = [self._import_descriptor(d) for d in results.capTable] if results else []
            payload = ReceivedPayload(
                segments,
                message,
                wire.RETURN_CONTENT_PATH,
                caps,
                results,
                content_word=header.content_word,
                limits=self._reader_limits,
            )
            self._complete_question(question, payload, None)
        question.no_finish_needed = header.no_finish_needed
        self._finish_returned(question)

    def _on_return_slow(self, message: Any, segments: Segments) -> None:
        body = getattr(message, "return")
        question = self.questions.get(body.answerId)
        if question is None or question.returned:
            raise RemoteProtocolError(
                f"return for question {body.answerId}, which is not awaiting one"
            )
        question.returned = True
        if body.releaseParamCaps:
            exports, question.param_exports = question.param_exports, []
            for export_id in exports:
                self._release_export(export_id, 1)
        which = body.which()
        if which == "results":
            self._complete_with_results(question, message, body.results, segments)
        elif which == "exception":
            self._complete_question(question, None, wire.read_exception(body.exception))
        elif which == "canceled":
            if not question.finish_sent:
                raise RemoteProtocolError(
                    f"return 'canceled' for question {question.id} never finished"
                )
            self._complete_question(question, None, Canceled("canceled"))
        elif which == "resultsSentElsewhere":
            if not question.yourself:
                raise RemoteProtocolError(
                    "resultsSentElsewhere for a call not sent with 'yourself'"
                )
            self._complete_question(question, None, Failed("results were sent elsewhere"))
        elif which == "takeFromOtherQuestion":
            self._take_from_other_question(question, body.takeFromOtherQuestion)
        else:
            raise RemoteProtocolError(f"return variant {which!r} is not supported (Level 3)")
        question.no_finish_needed = body.noFinishNeeded
        self._finish_returned(question)

    def _complete_with_results(
        self, question: Question, message: Any, results: Any, segments: Segments
    ) -> None:
        if question.finish_sent:
            # We finished with releaseResultCaps=true: the callee releases them itself.
            self._complete_question(question, None, Canceled("canceled"))
            return
        caps = [self._import_descriptor(d) for d in results.capTable]
        payload = ReceivedPayload(
            segments, message, wire.RETURN_CONTENT_PATH, caps, results, limits=self._reader_limits
        )
        self._complete_question(question, payload, None)

    def _take_from_other_question(self, question: Question, other_id: int) -> None:
        """rpc-protocol.md §6.2: the results are those of our answer ``other_id``."""
        other = self.answers.get(other_id)
        if other is None or not other.redirected:
            raise RemoteProtocolError(
                f"takeFromOtherQuestion names answer {other_id}, which was not sent to 'yourself'"
            )
        source = other.result.add_ref()

        def forward(done: CallResult) -> None:
            if done.error is not None:
                self._complete_question(question, None, done.error)
            else:
                payload = done.payload
                self._complete_question(question, SharedPayload(payload), None)
            source.release()

        source.add_done_callback(forward)

    def _complete_question(
        self, question: Question, payload: Payload | None, error: RpcError | None
    ) -> None:
        """Settle the question's pipelines (with embargoes) and then its result."""
        question.settled = True
        for path, hook in list(question.pipelines.items()):
            if error is not None:
                target: Hook = BrokenHook(error)
            else:
                assert payload is not None
                target = payload.cap_at(path) or null_hook()
            if hook.settle(target):
                self._start_embargo(hook)
        question.pipelines.clear()
        result, question.result = question.result, None
        if payload is not None and (result is None or not question.wanted):
            payload.release()
            payload = None
            error = error or Canceled("canceled")
        if result is not None:
            if error is not None:
                result.set_error(error)
            else:
                assert payload is not None
                result.set_result(payload)
        if question.returned:
            self._finish_returned(question)

    def _send_finish(self, question: Question, *, release_result_caps: bool) -> None:
        question.finish_sent = True
        message = wire.Message.new_message()
        body = message.init("finish")
        body.questionId = question.id
        body.releaseResultCaps = release_result_caps
        body.requireEarlyCancellationWorkaround = False  # rpc-protocol.md §13.5
        self._send_message(message, urgent=False)

    def _question_unwanted(self, question: Question) -> None:
        if question.returned:
            self._finish_returned(question)
        else:
            self._maybe_finish_early(question)

    def _finish_returned(self, question: Question) -> None:
        """Send the Finish of a returned question once nothing needs it any more.

        That is when its results have settled (a takeFromOtherQuestion may still be pending),
        every pipelined capability has been redirected (a Disembargo naming the question
        must leave before the Finish: rpc-protocol.md §13.4), and the caller has dropped the
        results (as C++ does when the response object dies), so that the Finish usually
        travels with the caller's next call.
        """
        if not question.returned or not question.settled:
            return
        if question.wanted or question.pipelines:
            return
        if not question.finish_sent and not question.no_finish_needed and self.closed is None:
            self._send_finish(question, release_result_caps=False)
        self._free_question_if_done(question, no_finish_needed=question.no_finish_needed)

    def _maybe_finish_early(self, question: Question) -> None:
        """Nobody wants the question any more: finish it before its return (cancellation)."""
        if question.returned or question.finish_sent or self.closed is not None:
            return
        if question.wanted or question.pipelines:
            return
        self._send_finish(question, release_result_caps=True)

    def _free_question_if_done(self, question: Question, *, no_finish_needed: bool) -> None:
        if question.returned and (question.finish_sent or no_finish_needed):
            if self.questions.get(question.id) is question:
                del self.questions[question.id]
                self._question_ids.free(question.id)

    def _new_question(self, result: CallResult | None) -> Question:
        question = Question(self, self._question_ids.allocate(), result)
        self.questions[question.id] = question
        return question

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
                self._release_export(getattr(cap.cap, cap.cap.which()), 1)
            return
        if which in ("bootstrap", "call"):
            question_id = (
                inner.bootstrap.questionId if which == "bootstrap" else inner.call.questionId
            )
            question = self.questions.get(question_id)
            if question is not None and not question.returned:
                question.returned = True
                question.finish_sent = True  # nothing to finish: the peer never saw it
                self._complete_question(
                    question, None, Unimplemented(f"peer does not implement {which}")
                )
                self._free_question_if_done(question, no_finish_needed=True)
            return
        raise RemoteProtocolError(f"peer did not understand our {which!r} message")

    # ================================================================== shutdown
    def abort(self, reason: str) -> None:
        """A protocol violation: send Abort, then close (rpc-protocol.md §10)."""
        if self.closed is not None:
            return
        self.abort_reason = reason
        message = wire.Message.new_message()
        body = message.init("abort")
        body.reason = reason
        body.type = int(ExceptionType.FAILED)
        self._send_message(message)
        self.close(Disconnected(f"connection aborted: {reason}"))

    def close(self, error: RpcError) -> None:
        """The connection is gone: fail and drop everything (rpc-protocol.md §10)."""
        if self.closed is not None:
            return
        self.closed = error
        questions, self.questions = self.questions, {}
        for question in questions.values():
            if not question.returned:
                question.returned = True
                self._complete_question(question, None, error)
        imports, self.imports = self.imports, {}
        for entry in imports.values():
            if isinstance(entry.hook, ImportPromiseHook) and not entry.hook.settled:
                entry.hook.settle(BrokenHook(error))
        embargoes, self.embargoes = self.embargoes, {}
        for hook in embargoes.values():
            hook.lift_embargo()
            hook.release()
        exports, self.exports = self.exports, {}
        self._export_by_hook.clear()
        for export in exports.values():
            export.hook.release()
        answers, self.answers = self.answers, {}
        for answer in answers.values():
            answer.result.cancel()
            answer.result.release()

    _HANDLERS: dict[int, Callable[[RpcSession, Any, Segments], None]] = {}


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
