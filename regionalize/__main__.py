from regionalize.cli import main

main(prog_name="regionalize")
