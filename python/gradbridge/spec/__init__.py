"""The training spec: losses, optimizers, parameter groups and LR schedules as a module's metadata
records them, each with its torch counterpart. Both the exporter (``gradbridge.export``) and the eager
reference (``gradbridge.reference``) read it, and it reads neither: the export's check runs the
reference, so the spec sits below both."""
