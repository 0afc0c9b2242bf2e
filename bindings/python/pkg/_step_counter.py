"""weft.StepCounter: the C step counter (weft_step_counter_*) behind
num_steps_per_communication, as a Python object.

Every decision comes from the C state machine (core/step_counter.h), the one the C++, Go
and Julia optimizers use, so all languages count alike; this class only converts
arguments and results."""

import operator

from . import lowlevel as _c

__all__ = ["StepCounter"]

_COUNTS = {"forward": _c.WEFT_COUNT_FORWARD, "backward": _c.WEFT_COUNT_BACKWARD}
# Indexed by weft_computation_event.
_EVENTS = {
    _c.WEFT_COMPUTATION_IGNORED: "ignored",
    _c.WEFT_COMPUTATION_COUNTED: "counted",
    _c.WEFT_COMPUTATION_COMMUNICATE: "communicate",
    _c.WEFT_COMPUTATION_MISUSE: "misuse",
}


class StepCounter:
    """Count computations and say when to communicate (the rules: core/step_counter.h).

    Every counted computation of a unit brings its countdown from J
    (steps_per_communication) towards 0; the one that reaches 0 means "communicate"
    (start the communication now); a step() then is an S (returns True: wait, combine,
    start over), a step() before is an s (returns False: local update only); a counted
    computation with the countdown already at 0 is a "misuse" (warn with
    misuse_warning). Needs no weft.init(). Not thread-safe.

    Parameters
    ----------
    steps_per_communication : int
        J, at least 1.
    counts : {"forward", "backward"}, optional
        What a computation is (what the warning names); default "forward".
    units : int, optional
        How many countdowns, at least 1 (an optimizer counting backward computations per
        parameter has one per parameter; a pass that finds several at 0 warns once).

    Raises
    ------
    ValueError
        `counts` is neither "forward" nor "backward".
    InvalidArgumentError
        steps_per_communication or units is below 1.

    Examples
    --------
    >>> c = weft.StepCounter(2)
    >>> c.computation(), c.step()
    ('counted', False)
    >>> c.computation(), c.step()
    ('communicate', True)
    """

    __slots__ = ("_ptr", "_counts", "_units")

    def __init__(self, steps_per_communication, counts="forward", units=1):
        self._ptr = None
        if counts not in _COUNTS:
            raise ValueError(f"StepCounter: counts must be 'forward' or 'backward', got {counts!r}")
        self._counts = counts
        self._units = operator.index(units)
        self._ptr = _c.weft_step_counter_create(operator.index(steps_per_communication),
                                                _COUNTS[counts], self._units)

    def __del__(self):
        ptr = getattr(self, "_ptr", None)
        if ptr is not None:
            self._ptr = None
            _c.weft_step_counter_destroy(ptr)

    def computation(self, unit=0, counted=True):
        """Record that a computation of `unit` finished, and say what it means.

        Parameters
        ----------
        unit : int, optional
            The unit, in [0, units); default 0.
        counted : bool, optional
            False for a computation that does not count (under no-grad, or no parameter
            requires grad); default True.

        Returns
        -------
        str
            "ignored" (counted=False), "counted", "communicate" (start the communication
            now) or "misuse" (warn with misuse_warning).

        Raises
        ------
        InvalidArgumentError
            `unit` is out of range.
        """
        event = _c.weft_step_counter_computation(self._ptr, operator.index(unit),
                                                 1 if counted else 0)
        return _EVENTS[event]

    def step(self):
        """Record a step(): True for an S (communicate), False for an s (local update).

        Returns
        -------
        bool

        Raises
        ------
        FailedPreconditionError
            No computation was counted yet (also a RuntimeError).
        """
        return _c.weft_step_counter_step(self._ptr)

    def countdown(self, unit=0):
        """J minus the unit's counted computations since the last S, floored at 0.

        Parameters
        ----------
        unit : int, optional
            The unit, in [0, units); default 0.

        Returns
        -------
        int
        """
        return _c.weft_step_counter_countdown(self._ptr, operator.index(unit))

    @property
    def steps_per_communication(self):
        """J: counted computations per communication.

        Setting it takes effect at once when nothing was counted since the last S, else at
        the next S; a value below 1 raises weft.InvalidArgumentError (a ValueError).
        """
        return _c.weft_step_counter_steps_per_communication(self._ptr)

    @steps_per_communication.setter
    def steps_per_communication(self, value):
        """At once when nothing was counted since the last S, else at the next S;
        weft.InvalidArgumentError (a ValueError) below 1."""
        _c.weft_step_counter_set_steps_per_communication(self._ptr, operator.index(value))

    @property
    def counts(self):
        """What a computation is: "forward" or "backward", as constructed."""
        return self._counts

    @property
    def units(self):
        """How many countdowns the counter keeps, as constructed."""
        return self._units

    @property
    def computations(self):
        """Counted computations (passes) since creation."""
        return _c.weft_step_counter_computations(self._ptr)[0]

    @property
    def computations_since_communication(self):
        """Counted computations (passes) since the last S."""
        return _c.weft_step_counter_computations(self._ptr)[1]

    @property
    def misuse_warning(self):
        """The warning for the last "misuse" ("" before any)."""
        return _c.weft_step_counter_misuse_warning(self._ptr)

    def __repr__(self):
        return (f"<weft.StepCounter: J={self.steps_per_communication}, counts {self._counts}, "
                f"{self._units} unit{'s' if self._units != 1 else ''}, "
                f"{self.computations_since_communication} since the last communication>")
