"""The MiniMax-M3 indexer-precision policy and the facts it decides on."""
