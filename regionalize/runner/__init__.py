"""The file runner: finds the files of a run (`discovery`), runs the codemod over each and writes the
results and the packages' runtime copies (`run`)."""
