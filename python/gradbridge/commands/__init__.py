"""The `gradbridge` commands, apart from the library: ``main`` parses the command line and each
other module here is one command (``parity``, ``demo``, ``doctor``, ``bench``, ``gradcheck``,
``replay``, ``online_demo``, ``online_bench``). They print and return exit codes; what they
compute lives in the library modules one level up."""
