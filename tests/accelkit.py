"""accelerate keeps process-wide singletons (the accelerator's state, the gradient state): a test that trains or
evaluates in this process more than once resets them between runs, so no setting leaks from one into the next."""


def reset() -> None:
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
